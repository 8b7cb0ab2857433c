"""The embedded default (`make run`) for several seeds, timed: SFT and RL accuracy per seed.

    python -m experiments.bench_default_run --seeds=0,1,2 --workdir=runs/default_bench \\
        --json=benchmarks/results/default_run.json

Runs `python -m experiments.train --config=configs/hidifftir.py:model=tiny` once per seed (a
fresh process each, as `make run` does) in `<workdir>/seed<k>`, resuming any that exist, and
writes per seed: greedy eval accuracy after SFT and after RL, the number of eval tasks, and
the seconds of SFT, RL and evaluation (the trainer's own clocks) and of the whole process; then
the gain over seeds, the commit and the machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from absl import app, flags

from tirjax.reporting import benchmark

flags.DEFINE_string("seeds", "0,1,2", "Comma-separated seeds.")
flags.DEFINE_string("workdir", "runs/default_bench", "Parent of the per-seed run directories.")
flags.DEFINE_string("json", "benchmarks/results/default_run.json", "Where the results go.")
flags.DEFINE_string("config", "configs/hidifftir.py:model=tiny", "The run config (the default).")
FLAGS = flags.FLAGS


def _git(*args) -> str:
  try:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def main(argv):
  del argv
  info = benchmark.machine(jax_info=False)
  seeds = [int(s) for s in FLAGS.seeds.split(",") if s.strip()]
  records = []
  for seed in seeds:
    workdir = os.path.join(FLAGS.workdir, f"seed{seed}")
    command = [sys.executable, "-m", "experiments.train", f"--config={FLAGS.config}",
               f"--config.seed={seed}", "--config.train.progress_bar=False",
               f"--workdir={workdir}"]
    start = time.perf_counter()
    subprocess.run(command, check=True)
    wall = time.perf_counter() - start
    with open(os.path.join(workdir, "summary.json")) as f:
      summary = json.load(f)
    with open(os.path.join(workdir, "config.json")) as f:
      config = json.load(f)
    sft, rl = summary["after_sft"], summary["after_rl"]
    records.append(dict(
        seed=seed, eval_tasks=config["env"]["eval_tasks"], sft_steps=config["sft"]["steps"],
        rl_steps=config["train"]["steps"], sft_accuracy=sft.get("eval/accuracy"),
        rl_accuracy=rl.get("eval/accuracy"),
        gain=rl.get("eval/accuracy", 0.0) - sft.get("eval/accuracy", 0.0),
        sft_unanswerable=sft.get("eval/unanswerable_rate"),
        rl_unanswerable=rl.get("eval/unanswerable_rate"),
        seconds=dict(summary.get("seconds", {}), process=round(wall, 1))))
    print(json.dumps(records[-1]), flush=True)
  gains = [r["gain"] for r in records]
  out = dict(
      command="python -m experiments.bench_default_run " + " ".join(sys.argv[1:]),
      config=FLAGS.config, commit=_git("rev-parse", "HEAD"),
      dirty=bool(_git("status", "--porcelain", "--untracked-files=no")),
      machine=info,
      runs=records, mean_gain=sum(gains) / len(gains), min_gain=min(gains))
  benchmark.write_result(FLAGS.json, out, indent=1)
  print(json.dumps({k: out[k] for k in ("mean_gain", "min_gain")}))


if __name__ == "__main__":
  app.run(main)
