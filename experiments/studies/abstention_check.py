"""GRPO at a high learning rate from an SFT warm start, under the judge's two abstention rules.

    python -m experiments.studies.abstention_check --warm_start=runs/h0/hf_export \\
        --workdir=runs/abstention --json=benchmarks/results/abstention_check.json

spec §6: `unable_to_answer` (R_out 0) is earned, not claimed. Under the old rule, which paid 0
for "I cannot answer" on answerable tasks, abstaining beats answering whenever the policy is
right less than half the time (2p − 1 < 0), and RL learns to abstain. This runs the same GRPO
(the HiDiffTIR protocol: `<answer>` tags, 16 rows, KL 0.001, entropy 0.001; lr 1e-3, 40 steps,
3 queries a step) from one warm start twice, `judge.abstention=earned` (the spec's) and
`claimed` (the old rule), and writes each run's eval accuracy and abstention rate before and
after, and its training reward, accuracy and abstention rate per step.
"""

from __future__ import annotations

import json
import os
import sys

from absl import flags

from tirjax import cli
from tirjax.reporting import benchmark, launch

flags.DEFINE_string("warm_start", None, "An HF export of the SFT warm start.")
flags.DEFINE_string("workdir", "runs/abstention", "Parent of the two run directories.")
flags.DEFINE_string("json", "benchmarks/results/abstention_check.json", "Where results go.")
flags.DEFINE_float("learning_rate", 1e-3, "GRPO's learning rate.")
flags.DEFINE_integer("steps", 40, "RL steps.")
flags.mark_flag_as_required("warm_start")
FLAGS = flags.FLAGS

RULES = ("earned", "claimed")
CONFIG = "configs/grpo.py:model=tiny"


def _overrides(rule: str) -> list[str]:
  return ["--config.rollout.n=16", "--config.rollout.answer_protocol=answer_tag",
          "--config.loss.kl_coef=0.001", "--config.loss.kl_estimator=k3",
          "--config.loss.entropy_coef=0.001", f"--config.optim.learning_rate={FLAGS.learning_rate}",
          f"--config.train.steps={FLAGS.steps}",
          # the tiny toolworld preset as it was when this was measured (before issue 26's
          # redesign): 3 queries a step, one update, T = 1, the old task mix
          "--config.train.queries_per_step=3", "--config.train.mini_batch_queries=0",
          "--config.rollout.temperature=1.0", "--config.train.tempered_policy=False",
          "--config.env.toolworld.p_direction=0.0",
          "--config.env.toolworld.hop_weights=(0.25,0.35,0.25,0.15)",
          "--config.sft.demos.p_confuse=0.0", "--config.step.logprob_chunk_size=256",
          f"--config.model.hf_checkpoint={FLAGS.warm_start}", "--config.sft.steps=0",
          "--config.train.progress_bar=False", f"--config.judge.abstention={rule}"]


def main(argv):
  del argv
  out = dict(command="python -m experiments.studies.abstention_check " + " ".join(sys.argv[1:]),
             machine=benchmark.machine(jax_info=False), runs={})
  for rule in RULES:
    # a finished run is only re-evaluated
    run = launch.train(CONFIG, os.path.join(FLAGS.workdir, rule), _overrides(rule))
    evals, steps = run.files.metrics("eval"), run.files.metrics("rl")
    keys = ("eval/accuracy", "eval/abstain_rate", "eval/mean_outcome")
    out["runs"][rule] = dict(
        command=" ".join(run.command[1:]),
        before={k: evals[0].get(k) for k in keys}, after={k: evals[-1].get(k) for k in keys},
        steps=[dict(step=x["step"], reward=x["reward/mean"], accuracy=x["train/accuracy"],
                    abstain_rate=x.get("train/abstain_rate"), kl=x.get("loss/kl"))
               for x in steps])
    print(rule, json.dumps({"before": out["runs"][rule]["before"],
                            "after": out["runs"][rule]["after"]}), flush=True)
  benchmark.write_result(FLAGS.json, out, indent=1)


if __name__ == "__main__":
  cli.run(main)
