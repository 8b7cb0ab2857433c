"""The embedded default (`make run`) for several seeds, timed, with RL's headroom and gain.

    python -m benchmarks.bench_default_run --seeds=0,1,2 --sampled_seeds=0,1,2 \\
        --control_seed=0 --workdir=runs/default_bench --json=benchmarks/results/default_run.json

Runs the trainer on `make run`'s config, configs/hidifftir.py:model=tiny, once per seed (a
fresh process each, as `make run` does) in `<workdir>/seed<k>`, resuming any that exist, and
writes per seed, after SFT and after RL: greedy eval accuracy, and pass@1/4/16 at the rollout
temperature with the shares of tasks whose samples are all wrong or mixed and the share of
samples that failed first by each kind (`failure/<kind>`, `tirjax.env.toolworld.failures`)
(`--eval_samples` episodes per task, for the `--sampled_seeds`); the gains; the share of RL
steps' groups with mixed outcomes over the first and the last 5 steps; the seconds of SFT, RL
and evaluation (the trainer's own clocks) and of the whole process. Then the gains' minimum
over seeds, the commit and the machine (its CPU model: the same seed's SFT reaches different
accuracies on different CPUs).

`--control_seed=K` adds the fair control: the same config and seed with no RL and the SFT
steps extended by as many as fit in seed K's RL minutes (at that run's SFT seconds per step),
in `<workdir>/control<k>`; whether RL beats it is a finding either way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Optional

from absl import flags

from tirjax import cli
from tirjax.reporting import benchmark, launch

flags.DEFINE_string("seeds", "0,1,2", "Comma-separated seeds.")
flags.DEFINE_string("workdir", "runs/default_bench", "Parent of the per-seed run directories.")
flags.DEFINE_string("json", "benchmarks/results/default_run.json", "Where the results go.")
flags.DEFINE_string("config", "configs/hidifftir.py:model=tiny", "The run config (the default).")
flags.DEFINE_integer("control_seed", None, "Also run the more-SFT control for this seed.")
flags.DEFINE_integer("eval_samples", 16, "Episodes sampled per eval task for pass@k "
                     "(sampler.eval_samples; the default itself evaluates greedily only).")
flags.DEFINE_string("sampled_seeds", None, "Comma-separated seeds that get the sampled "
                    "evaluation (pass@k; about 7 minutes per evaluation on 2 cores); all "
                    "seeds when unset. The others run exactly `make run`'s config.")
FLAGS = flags.FLAGS

EVAL_KEYS = {"greedy": "eval/accuracy", "pass@1": "eval/pass@1", "pass@4": "eval/pass@4",
             "pass@16": "eval/pass@16", "mixed": "eval/sampled_mixed",
             "all_wrong": "eval/sampled_all_wrong", "abstain_rate": "eval/abstain_rate",
             "unanswerable_rate": "eval/unanswerable_rate"}


def _git(*args) -> str:
  try:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def _train(workdir: str, seed: int, overrides: tuple = ()) -> launch.Launched:
  """Runs (or resumes) one trainer process."""
  return launch.train(FLAGS.config, workdir, (f"--config.seed={seed}",
                                              "--config.train.progress_bar=False", *overrides))


def _evals(metrics: dict) -> dict:
  out = {name: metrics[key] for name, key in EVAL_KEYS.items() if key in metrics}
  failures = {k.removeprefix("eval/"): v for k, v in metrics.items()
              if k.startswith("eval/failure/")}
  return {**out, **failures}


def _mean(values) -> Optional[float]:
  values = [v for v in values if v is not None]
  return sum(values) / len(values) if values else None


def record(seed: int, run: launch.Launched) -> dict:
  """One seed's figures from its run directory."""
  summary, config = run.files.summary(), run.files.config()
  sft, rl = _evals(summary["after_sft"]), _evals(summary["after_rl"])
  mixed = [r.get("groups/mixed_share") for r in run.files.metrics("rl")]
  gains = {f"gain_{k}": rl[k] - sft[k] for k in ("greedy", "pass@1") if k in sft and k in rl}
  return dict(
      seed=seed, eval_tasks=config["env"]["eval_tasks"],
      eval_samples=config["sampler"]["eval_samples"], sft_steps=config["sft"]["steps"],
      rl_steps=config["train"]["steps"], after_sft=sft, after_rl=rl, **gains,
      headroom=(sft["pass@16"] - sft["greedy"]) if "pass@16" in sft else None,
      mixed_groups_first5=_mean(mixed[:5]), mixed_groups_last5=_mean(mixed[-5:]),
      seconds=dict(summary.get("seconds", {}), process=round(run.wall_s, 1)))


def control(seed: int, run: dict) -> dict:
  """The same minutes on more SFT instead of RL (see the module docstring)."""
  seconds = run["seconds"]
  per_step = seconds["sft"] / run["sft_steps"]
  extra = int(round(seconds["rl"] / per_step))
  out = record(seed, _train(os.path.join(FLAGS.workdir, f"control{seed}"), seed, (
      f"--config.sft.steps={run['sft_steps'] + extra}", "--config.train.steps=0",
      f"--config.sampler.eval_samples={run['eval_samples']}")))
  out["extra_sft_steps"] = extra
  out["vs_rl"] = {k: run["after_rl"][k] - out["after_sft"][k]
                  for k in ("greedy", "pass@1") if k in run["after_rl"] and k in out["after_sft"]}
  return out


def main(argv):
  del argv
  info = benchmark.machine(jax_info=False)
  # The code the runs use: read before them, since the tree may move on while they train.
  commit, dirty = _git("rev-parse", "HEAD"), bool(_git("status", "--porcelain",
                                                       "--untracked-files=no"))
  seeds = [int(s) for s in FLAGS.seeds.split(",") if s.strip()]
  records = []
  sampled = seeds if FLAGS.sampled_seeds is None else [
      int(s) for s in FLAGS.sampled_seeds.split(",") if s.strip()]
  for seed in seeds:
    workdir = os.path.join(FLAGS.workdir, f"seed{seed}")
    overrides = ((f"--config.sampler.eval_samples={FLAGS.eval_samples}",)
                 if seed in sampled and FLAGS.eval_samples else ())
    records.append(record(seed, _train(workdir, seed, overrides)))
    print(json.dumps(records[-1]), flush=True)
  out = dict(
      command="python -m benchmarks.bench_default_run " + " ".join(sys.argv[1:]),
      config=FLAGS.config, commit=commit, dirty=dirty, machine=info, runs=records)
  for key in ("gain_greedy", "gain_pass@1", "headroom"):
    values = [r[key] for r in records if r.get(key) is not None]
    if values:
      out[f"min_{key}"], out[f"mean_{key}"] = min(values), sum(values) / len(values)
  if FLAGS.control_seed is not None:
    (run,) = [r for r in records if r["seed"] == FLAGS.control_seed]
    out["control"] = control(FLAGS.control_seed, run)
    print(json.dumps(out["control"]), flush=True)
  benchmark.write_result(FLAGS.json, out, indent=1)
  print(json.dumps({k: v for k, v in out.items() if k.startswith(("min_", "mean_"))}))


if __name__ == "__main__":
  cli.run(main)
