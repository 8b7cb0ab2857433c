"""An RL step with the critic (`ppo`, `turn_ppo`) against one without (`grpo`), through the
trainer on the tiny model (issue 53).

    python -m benchmarks.bench_critic_step --json=benchmarks/results/bench_critic_step_cpu.json

Each estimator runs `--steps` RL steps of `tirjax.testing.short_runs.short_config` (no SFT,
`--queries` queries of 2 rows per step, episodes of at most 2 steps of 16 tokens, the packed
default for the policy and the critic), in its own process-local run directory. Per step after the first
(which compiles), the trainer's own phase clocks (`time/<phase>_s`): the step is the sum of
the rollout, values, advantages, critic, reference and update phases (evaluation excluded);
reported as the median over those steps, with the critic's two phases (its forward, `values`,
and its update, `critic`) on their own. The sampled episodes differ between estimators only
through the policy's updates, so the rollout phase is shown but the comparison is the trainer's
phases. The result records the machine (its CPU as /proc/cpuinfo names it).
"""

from __future__ import annotations

import statistics
import tempfile

from absl import app, flags

from tirjax import cli
from tirjax.reporting import benchmark
from tirjax.rundir import RunDir
from tirjax.testing.short_runs import short_config
from tirjax.trainer.train import run

_JSON = flags.DEFINE_string("json", None, "write the result to this JSON file")
_STEPS = flags.DEFINE_integer("steps", 5, "RL steps per estimator (the first is not timed)")
_QUERIES = flags.DEFINE_integer("queries", 2, "queries per RL step (2 rows each)")
_ESTIMATORS = flags.DEFINE_list("estimators", ["grpo", "ppo", "turn_ppo"], "estimators to run")

PHASES = ("rollout", "values", "advantages", "critic", "reference", "update")


def timings(name: str, steps: int, queries: int) -> dict:
  """Median seconds per phase over steps 2..`steps` of a short run of `name`."""
  with tempfile.TemporaryDirectory() as workdir:
    run(short_config(name, steps=steps, **{
        "train.queries_per_step": queries, "train.eval_every": 0, "env.eval_tasks": 1,
        "train.export_final": False, "train.checkpoint_every": steps}), workdir)
    rows = [r for r in RunDir(workdir).metrics("rl") if r["step"] > 1]
  per_phase = {p: statistics.median(r.get(f"time/{p}_s", 0.0) for r in rows) for p in PHASES}
  trainer = [sum(r.get(f"time/{p}_s", 0.0) for p in PHASES if p != "rollout") for r in rows]
  return {"steps_timed": len(rows), "median_s": per_phase,
          "median_trainer_s": statistics.median(trainer),
          "median_step_s": statistics.median(
              sum(r.get(f"time/{p}_s", 0.0) for p in PHASES) for r in rows)}


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  result = {"machine": benchmark.machine(), "steps": _STEPS.value, "queries": _QUERIES.value,
            "estimators": {n: timings(n, _STEPS.value, _QUERIES.value)
                           for n in _ESTIMATORS.value}}
  base = result["estimators"].get("grpo")
  if base:
    for name, t in result["estimators"].items():
      t["trainer_s_over_grpo"] = t["median_trainer_s"] / base["median_trainer_s"]
  print(benchmark.write_result(_JSON.value, result))


if __name__ == "__main__":
  cli.run(main)
