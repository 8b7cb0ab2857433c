"""Run an ablation grid: every cell of the grid config at every seed, then its report.

    python -m experiments.ablate --config=configs/ablate.py --workdir=runs/ablate
    python -m experiments.ablate --config=configs/ablate.py:grid=portool,seeds=5 \\
        --workdir=runs/portool --parallel=4  # on >= 8 cores

Each run is an `experiments.train` run directory, `<workdir>/<label>/seed<k>`, trained by
`python -m experiments.train --config=configs/cell.py:<run dir> --workdir=<run dir>` in its own
process (`--parallel` at a time; output in its train.log); one SFT warm start per seed,
`<workdir>/sft-<hash>/seed<k>`, serves the RL cells of that seed (`tirjax.ablation.grid`).
Every config is checked before anything runs. Restarting skips finished runs and resumes the
others from their checkpoints. At the end the report of all runs goes to `<workdir>/report/`
(report.md, summary.csv, paired.csv, learning curves); the exit status is 1 if a run failed.
"""

from __future__ import annotations

import os
import sys

from absl import flags
from ml_collections import config_flags

import configs
from tirjax import ablation, cli
from tirjax.reporting import launch

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Grid config, e.g. configs/ablate.py",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "The grid's directory (created, or resumed).")
flags.DEFINE_integer("parallel", 1, "Runs at a time, each in its own process.", lower_bound=1)
flags.mark_flags_as_required(["config", "workdir"])

CELL_CONFIG = os.path.join(os.path.dirname(os.path.abspath(configs.__file__)), "cell.py")


def cell_command(job: ablation.Job) -> list[str]:
  """The trainer's command line for one prepared run directory."""
  return launch.train_command(f"{CELL_CONFIG}:{job.workdir}", job.workdir)


def check(argv) -> list[ablation.Job]:
  """What `main` checks before any run: every run of the grid, every config resolved."""
  del argv
  return ablation.plan(FLAGS.config, FLAGS.workdir)


def main(argv) -> None:
  grid, workdir = FLAGS.config, FLAGS.workdir
  try:
    jobs = check(argv)
    results = ablation.run_grid(jobs, workdir, cell_command, parallel=FLAGS.parallel,
                                compilation_cache=grid.compilation_cache)
  except ablation.GridError as e:
    sys.exit(f"ablate: {e}")
  paths = ablation.write_report(jobs, workdir, baseline=grid.report.baseline,
                                last_rl=grid.report.last_rl, title=grid.report.title)
  with open(paths["report.md"]) as f:
    print(f.read())
  bad = [r for r in results if r.state not in ("finished", "skipped")]
  print(f"ablate: {len(results) - len(bad)}/{len(results)} runs finished; report in "
        f"{os.path.dirname(paths['report.md'])}", flush=True)
  if bad:
    sys.exit(f"ablate: not finished: {', '.join(r.job.name for r in bad)}")


if __name__ == "__main__":
  cli.run(main)
