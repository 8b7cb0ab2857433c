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

import os
import sys
import time
import types
from typing import Optional

from absl import app, flags
from flax import nnx
from ml_collections import config_flags

from tirjax import cli, rundir
from tirjax.episodes import judging
from tirjax.trainer import prepare, resolve, samplers
from tirjax.env import environments
from tirjax.trainer.evaluation import evaluate_run
from tirjax.trainer.progress import METRIC_LABELS, Progress
from tirjax.trainer.tasks import TaskSource, load_tokenizer
from tirjax.models.hf_io import load_hf
from tirjax.reporting import benchmark

SPLITS = ("eval", "train", "all")


def policy_directory(policy: str) -> str:
  """The HF checkpoint directory of `policy` (itself, or a run directory's `hf_export/`)."""
  if not os.path.isdir(policy):
    raise resolve.ConfigError(f"policy: {policy!r} is not a directory")
  if os.path.exists(os.path.join(policy, "config.json")) and any(
      f.endswith(".safetensors") for f in os.listdir(policy)):
    return policy
  export = os.path.join(policy, rundir.HF_EXPORT)
  if os.path.isdir(export):
    return export
  raise resolve.ConfigError(f"policy: {policy!r} is neither a Hugging Face checkpoint directory "
                   "(config.json and *.safetensors) nor a run directory with hf_export/ (a run "
                   "exports when it finishes, with train.export_final=True)")


def evaluation(config, policy: str, out: str, tasks: Optional[int] = None,
               split: str = "eval") -> tuple[resolve.Experiment, str]:
  """The checked options of the evaluation of `policy` on the first `tasks` (default
  `env.eval_tasks`) of `split`, its shapes fitted to those tasks (`prepare.experiment`), and
  the policy's checkpoint directory: everything `evaluate_policy` checks before any compute.
  Sets `config`'s policy (`model.hf_checkpoint`), `sft.steps` (0) and `env.eval_tasks`."""
  environment = environments.get(config.env.name)
  if environment.not_a_benchmark:
    raise resolve.ConfigError(f"env.name={config.env.name}: {environment.not_a_benchmark}")
  if split not in SPLITS:
    raise resolve.ConfigError(f"split: must be one of {SPLITS}, got {split!r}")
  if split == "all" and environment.draw is not None:
    raise resolve.ConfigError(f"split=all: {config.env.name} draws its tasks; evaluate its "
                              "eval or train split")
  path = os.path.join(out, "results.json")
  if os.path.exists(path):
    raise FileExistsError(f"out: {path} exists; choose another --out (results are never "
                          "overwritten)")
  checkpoint = policy_directory(policy)
  with config.unlocked():
    config.model.hf_checkpoint = checkpoint
    config.sft.steps = 0  # nothing is trained: the trainer's sections are only checked
    if tasks is not None:
      config.env.eval_tasks = tasks
  return prepare.experiment(config, {split: config.env.eval_tasks}), checkpoint


def evaluate_policy(config, policy: str, out: str, tasks: Optional[int] = None,
                    command: str = "", split: str = "eval") -> dict:
  """Evaluates `policy` as `config` says on the first `tasks` (default `env.eval_tasks`) of
  `split`; writes and returns the results."""
  exp, checkpoint = evaluation(config, policy, out, tasks, split)
  path = os.path.join(out, "results.json")
  info = benchmark.machine()
  start = time.perf_counter()
  tokenizer = load_tokenizer(checkpoint)
  source = TaskSource(exp.env, seed=exp.seed)
  sampler = None
  try:
    eval_tasks = source.tasks(split, exp.env.eval_tasks)
    judge = judging.make_judge(exp.judge)
    graphdef, params = nnx.split(load_hf(checkpoint))
    os.makedirs(out, exist_ok=True)
    state = types.SimpleNamespace(params=params, policy_version=0)
    sampler = samplers.make_sampler(exp.sampler, exp.step.logprob_chunk_size, graphdef, state,
                                     out, checkpoint, exp.rollout)
    metrics = evaluate_run(exp, sampler, tokenizer, eval_tasks, judge, graphdef, params,
                           samples=exp.sampler.eval_samples,
                           progress=Progress().evaluation(len(eval_tasks)))
  finally:
    if sampler is not None:
      sampler.close()
    source.close()
  result = {"command": command or "experiments.evaluate.evaluate_policy", "policy": policy,
            "checkpoint": checkpoint, "env": exp.env.name, "split": split,
            "tasks": len(eval_tasks),
            "sampler": exp.sampler.kind, "temperature": exp.sampler.eval_temperature,
            "samples": exp.sampler.eval_samples, "sample_temperature": exp.rollout.temperature,
            "answer_protocol": exp.rollout.answer_protocol,
            "solve_scoring": exp.rollout.solve_scoring,
            "answer_in_tool_message": exp.env.answer_in_tool_message,
            "metrics": metrics, "seconds": round(time.perf_counter() - start, 1),
            "machine": info}
  benchmark.write_result(path, result)
  with open(os.path.join(out, "results.md"), "w") as f:
    f.write(markdown(result))
  return result


def markdown(result: dict) -> str:
  sampled = (f"; {result['samples']} samples per task at temperature "
             f"{result['sample_temperature']} (pass@k)" if result.get("samples") else "")
  lines = [f"# {result['env']}: {result['checkpoint']}\n",
           f"{result['tasks']} tasks, {result['sampler']} sampler at temperature "
           f"{result['temperature']}{sampled}, {result['answer_protocol']} protocol, "
           f"{result['seconds']} s.\n", "| metric | value |", "| --- | ---: |"]
  for label, key in METRIC_LABELS:
    if key in result["metrics"]:
      lines.append(f"| {label} | {result['metrics'][key]:.3f} |")
  for key, value in result["metrics"].items():
    if key.startswith("eval/bfcl/"):
      lines.append(f"| BFCL {key.split('/')[-1]} accuracy | {value:.3f} |")
    if key.startswith("eval/failure/"):
      lines.append(f"| samples failed first by {key.split('/')[-1]} | {value:.3f} |")
  return "\n".join(lines) + "\n"


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
