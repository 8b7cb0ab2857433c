"""Benchmark: the whole test suite's wall time on this machine, with its slowest tests (issue 52).

    python -m benchmarks.bench_test_suite --json=benchmarks/results/test_suite_zen5.json

Runs `make test`'s pytest command (2 xdist workers, `--dist loadgroup --max-worker-restart=0`; the
environments must exist: `make setup vllm-env`) in a subprocess with `--durations=N`, from an empty
JAX compilation cache as a fresh clone has (`--fresh_cache`), and records the machine (CPU family
and model: the suite's time differs by CPU), the commit, the wall time, the counts pytest reports,
the load before and after (a shared machine shows here), the host's mean CPU use and
the slowest tests. The README's table of suite times per CPU cites these files.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

from absl import app, flags

from tirjax import cli
from tirjax.reporting import benchmark
from tirjax.reporting.pytest_output import parse

flags.DEFINE_string("json", None, "where to write the result")
flags.DEFINE_integer("durations", 30, "how many of the slowest tests to record")
flags.DEFINE_bool("fresh_cache", True, "remove the checkout's .jax_cache first (as a fresh clone)")
flags.DEFINE_string("note", "", "what else ran on the machine meanwhile, if anything")
flags.mark_flag_as_required("json")
FLAGS = flags.FLAGS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cpu_seconds() -> float:
  """Busy CPU seconds of the whole host since boot (every process, not only the suite's)."""
  with open("/proc/stat") as f:
    fields = [int(x) for x in f.readline().split()[1:]]
  idle = fields[3] + fields[4]  # idle, iowait
  return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def main(argv):
  del argv
  if FLAGS.fresh_cache:
    shutil.rmtree(os.path.join(ROOT, ".jax_cache"), ignore_errors=True)
  python = os.path.join(ROOT, ".venv", "bin", "python")
  command = [python, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup",
             "--max-worker-restart=0", f"--durations={FLAGS.durations}", "-p", "no:cacheprovider"]
  info = benchmark.machine(jax_info=False)
  commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
  dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                              cwd=ROOT, capture_output=True, text=True).stdout.strip())
  cpu0, start = _cpu_seconds(), time.perf_counter()
  proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
  wall = time.perf_counter() - start
  info["load_average_end"] = list(os.getloadavg())
  result = {"command": " ".join(["python"] + command[1:]), "commit": commit, "dirty": dirty,
            "machine": info, "note": FLAGS.note, "exit_code": proc.returncode,
            "wall_s": round(wall, 1), "wall_min": round(wall / 60, 1),
            "host_cores_busy_mean": round((_cpu_seconds() - cpu0) / wall, 2),
            **parse(proc.stdout)}
  os.makedirs(os.path.dirname(os.path.abspath(FLAGS.json)), exist_ok=True)
  with open(FLAGS.json, "w") as f:
    json.dump(result, f, indent=1)
  print(f"{result['counts']} in {result['wall_min']} min (exit {proc.returncode}); "
        f"{result['host_cores_busy_mean']} cores busy on average; {FLAGS.json}")
  if proc.returncode:
    print(proc.stdout[-5000:], file=sys.stderr)
  return proc.returncode


if __name__ == "__main__":
  cli.run(main)
