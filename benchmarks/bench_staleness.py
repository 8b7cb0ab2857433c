"""k-step off-policy rollouts against the synchronous loop, side by side in one run (issue 55).

    python -m benchmarks.bench_staleness --ks=0,1,2 --workdir=runs/staleness_bench \\
        --json=benchmarks/results/bench_staleness_cpu.json

One warm start (`--config`'s SFT, `train.steps=0`, in `<workdir>/warm`), then the same RL
phase from its export once per k (`train.max_staleness=k`, `sft.steps=0`, in
`<workdir>/k<k>`), every run with the token-level correction that k >= 1 needs
(`loss.rollout_correction.is_level=token`; on the default's tempered policy the JAX sampler
then reports the tempered log-probs, spec §5), so that k is all that differs. Per k, from the
trainer's own clocks (`summary.json`, the per-step `time/*` metrics):
- the RL phase's wall and CPU seconds (evaluations excluded) and the cores it kept busy;
- the sampling seconds (the loop's own, `time/rollout_s`, and the thread's,
  `time/sample_ahead_s`) and the update's;
- the learner's wait for rows: `time/rollout_s` (at k = 0 the whole sampling; at k >= 1 step
  0's and the pops) plus `time/wait_rollouts_s` (waiting on the thread);
- the sampler's wait for weights: the RL wall minus the sampling seconds (at k >= 1 also the
  thread's own count, `time/sampler_wait_weights_s`);
- the greedy eval accuracy before and after RL (one seed: a check that k >= 1 still learns,
  not a verdict; the issue's 3-seed comparison is `bench_default_run`'s job).
Writes `--json` and the markdown beside it; an existing result is never overwritten. The runs
resume where they stopped (the trainer's own resume), so an interrupted benchmark can go on.
"""

from __future__ import annotations

import json
import os
import sys

from absl import flags

from tirjax import cli, rundir
from tirjax.reporting import benchmark, launch

flags.DEFINE_string("config", "configs/hidifftir.py:model=tiny", "The run config (`make run`'s).")
flags.DEFINE_string("ks", "0,1,2", "Comma-separated values of train.max_staleness.")
flags.DEFINE_integer("seed", 0, "The seed of every run.")
flags.DEFINE_integer("rl_steps", None, "RL steps (default: the config's).")
flags.DEFINE_string("workdir", "runs/staleness_bench", "Parent of the run directories.")
flags.DEFINE_string("json", "benchmarks/results/bench_staleness_cpu.json", "Where results go.")
flags.DEFINE_list("extra", [], "More --config.<key>=<value> overrides for every run.")
FLAGS = flags.FLAGS


def _overrides(*extra: str) -> tuple[str, ...]:
  return (f"--config.seed={FLAGS.seed}", "--config.train.progress_bar=False",
          "--config.loss.rollout_correction.is_level=token", *FLAGS.extra, *extra)


def _sum(records: list, key: str) -> float:
  return float(sum(r.get(key, 0.0) for r in records))


def record(k: int, run: launch.Launched, before: dict) -> dict:
  """One k's figures from its run directory (see the module docstring); `before`: the warm
  start's evaluation."""
  summary, steps = run.files.summary(), run.files.metrics("rl")
  wall, cpu = summary["seconds"]["rl"], summary["cpu_seconds"]["rl"]
  loop_sampling = _sum(steps, "time/rollout_s")
  sampling = loop_sampling + _sum(steps, "time/sample_ahead_s")
  return dict(
      k=k, rl_steps=len(steps), rl_wall_s=wall, rl_cpu_s=cpu,
      cores_busy=cpu / wall if wall > 0 else None, sampling_s=sampling,
      update_s=_sum(steps, "time/update_s"),
      learner_wait_s=loop_sampling + _sum(steps, "time/wait_rollouts_s"),
      sampler_wait_s=wall - sampling,
      sampler_wait_weights_s=_sum(steps, "time/sampler_wait_weights_s") if k else None,
      staleness_max=max((r.get("staleness/max", 0) for r in steps), default=0),
      greedy_before=before.get("eval/accuracy"),
      greedy_after=summary["after_rl"].get("eval/accuracy"),
      process_s=round(run.wall_s, 1))


def markdown(out: dict) -> str:
  m = out["machine"]
  lines = [
      "# k-step off-policy rollouts: the RL phase at each k", "",
      f"Command: `{out['command']}`", "",
      f"Machine: {m.get('cpu')} (family {m.get('cpu_id', {}).get('family')}, "
      f"model {m.get('cpu_id', {}).get('model')}), {m.get('cpus')} cores; load average "
      f"{out['load_average_start']} at the start, {out['load_average_end']} at the end. "
      f"Config `{out['config']}`, seed {out['seed']}, commit {out['commit']}.", "",
      "| k | RL steps | RL wall s | cores busy | sampling s | update s | learner waits s | "
      "sampler waits s | wall vs k = 0 | greedy before → after |",
      "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
  base = out["runs"][0]["rl_wall_s"] if out["runs"] and out["runs"][0]["k"] == 0 else None
  for r in out["runs"]:
    ratio = f"{r['rl_wall_s'] / base:.3f}" if base else "—"
    lines.append(
        f"| {r['k']} | {r['rl_steps']} | {r['rl_wall_s']:.1f} | {r['cores_busy']:.2f} | "
        f"{r['sampling_s']:.1f} | {r['update_s']:.1f} | {r['learner_wait_s']:.1f} | "
        f"{r['sampler_wait_s']:.1f} | {ratio} | {r['greedy_before']:.3f} → "
        f"{r['greedy_after']:.3f} |")
  return "\n".join(lines) + "\n"


def main(argv):
  del argv
  ks = [int(k) for k in FLAGS.ks.split(",") if k.strip()]
  if not ks or any(k < 0 for k in ks):
    raise ValueError(f"--ks: integers >= 0, got {FLAGS.ks!r}")
  if os.path.exists(FLAGS.json):
    raise FileExistsError(f"--json={FLAGS.json} exists; results are never overwritten")
  start_load = [round(x, 2) for x in os.getloadavg()]
  warm = os.path.join(FLAGS.workdir, "warm")
  before = launch.train(FLAGS.config, warm, _overrides("--config.train.steps=0")
                        ).files.summary()["after_sft"]
  steps = () if FLAGS.rl_steps is None else (f"--config.train.steps={FLAGS.rl_steps}",)
  runs = []
  for k in ks:  # the warm start's evaluation is every run's first: not run again
    run = launch.train(FLAGS.config, os.path.join(FLAGS.workdir, f"k{k}"), _overrides(
        f"--config.model.hf_checkpoint={os.path.join(warm, rundir.HF_EXPORT)}",
        "--config.sft.steps=0", "--config.train.eval_at_start=False", *steps,
        f"--config.train.max_staleness={k}"))
    runs.append(record(k, run, before))
    print(json.dumps(runs[-1]), flush=True)
  out = dict(command="python -m benchmarks.bench_staleness " + " ".join(sys.argv[1:]),
             config=FLAGS.config, seed=FLAGS.seed, commit=launch_commit(),
             machine=benchmark.machine(jax_info=False), load_average_start=start_load,
             load_average_end=[round(x, 2) for x in os.getloadavg()], runs=runs)
  benchmark.write_result(FLAGS.json, out, indent=1)
  benchmark.write_markdown(FLAGS.json.removesuffix(".json") + ".md", markdown(out))
  print(markdown(out))


def launch_commit() -> str:
  import subprocess  # pylint: disable=import-outside-toplevel
  try:
    return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


if __name__ == "__main__":
  cli.run(main)
