"""Evaluate a policy on a dataset with each paper's metrics.

    python -m experiments.evaluate --config=configs/hidifftir.py:env=toolhop \\
        --policy=runs/default --out=runs/default/eval_toolhop

With `env=ftrl` or `env=bfcl` in place of `env=toolhop` the example evaluates those; the rollout
shapes are sized from the tasks evaluated, with the policy's tokenizer (`prepare.experiment`).
`--policy`: a Hugging Face checkpoint directory (config.json and safetensors), or a trainer run
directory, whose `hf_export/` is then evaluated. `--config`: the experiment config whose
environment, rollout protocol, judge and sampler (`sampler=jax|vllm`) the evaluation follows;
its `model.hf_checkpoint` becomes the policy. One greedy episode per eval task
(`env.eval_tasks`, or `--tasks`), as the trainer's evaluation runs it; with
`--config.sampler.eval_samples=16` also 16 episodes per task at `rollout.temperature`, scored
as pass@1/4/16 and the shares of tasks whose samples are all wrong, mixed or all right; on
toolworld, the policy's preference for the directions its questions state
(`tirjax.env.toolworld.direction`) and what each wrong sample got wrong first
(`tirjax.env.toolworld.failures`: direction, a miscopied argument, format, ...). Writes
`<out>/results.json` and `<out>/results.md` (an existing result is never overwritten) and
prints the table. Metrics:
  * every dataset: PORTool's four axes (accuracy, average tool-call steps, unanswerable rate,
    formatting reward) and the mean outcome;
  * FTRL: Solve-P/R/F1 as bytedance/FTRL's scorer counts them (`rollout.solve_scoring`);
  * ToolHop: answer correctness, the paper's containment (`env.answer_in_tool_message` adds
    FTRL's scorer's rule).
  * BFCL multi-turn: accuracy per category and overall, decided by bfcl-eval's own
    multi-turn checker on episodes that follow its inference loop (user turns in order, held-back
    functions at their turn, 20 steps a turn); `rollout.max_steps` caps the steps of a whole
    episode and must hold every turn (an episode cut short fails, as bfcl-eval fails a
    force-terminated entry). `--split=all` evaluates the whole benchmark (800 entries).
"""

from __future__ import annotations

import sys

from absl import app, flags
from ml_collections import config_flags

from tirjax import cli
from tirjax.trainer import resolve
from tirjax.trainer.policy_eval import SPLITS, evaluate_policy, evaluation, markdown


def define_flags() -> None:
  """The command's flags. Defined when it runs (`_main`), not on import: the tests import this
  module beside experiments.train, whose --config flag has the same name."""
  config_flags.DEFINE_config_file("config", None, "the experiment config the evaluation "
                                  "follows, e.g. configs/hidifftir.py:env=toolhop",
                                  lock_config=True)
  flags.DEFINE_string("policy", None, "an HF checkpoint directory or a run directory")
  flags.DEFINE_string("out", None, "where results.json and results.md go")
  flags.DEFINE_integer("tasks", None, "eval tasks (default: the config's env.eval_tasks)",
                       lower_bound=1)
  flags.DEFINE_enum("split", "eval", SPLITS, "which tasks of a real dataset: its eval split (as "
                    "the trainer's evaluation), train, or all (a benchmark evaluated whole)")
  flags.mark_flags_as_required(["config", "policy", "out"])


def check(argv) -> resolve.Experiment:
  """What `main` checks before any compute (`evaluation`), for the parsed flags."""
  _no_arguments(argv)
  f = flags.FLAGS
  return evaluation(f.config, f.policy, f.out, f.tasks, f.split)[0]


def main(argv) -> None:
  _no_arguments(argv)
  f = flags.FLAGS
  result = evaluate_policy(f.config, f.policy, f.out, f.tasks,
                           command="python -m experiments.evaluate " + " ".join(sys.argv[1:]),
                           split=f.split)
  print(markdown(result))


def _no_arguments(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")


def _main() -> None:
  define_flags()
  cli.run(main)


if __name__ == "__main__":
  _main()
