"""Launching a training run from a script, and reading what it wrote.

    run = launch.train("configs/grpo.py:model=tiny", "runs/x", ["--config.train.steps=4"])
    run.files.summary(), run.files.metrics("rl"), run.wall_s, run.command

One `python -m experiments.train --config=<config> <overrides> --workdir=<workdir>` process
per call, in the foreground, its output passed through. The trainer resumes an unfinished run
directory and only re-evaluates a finished one. Its files are read through `rundir.RunDir`. An
ablation grid starts the same command line (`train_command`), several at a time
(`tirjax.ablation.runner`).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from typing import Sequence

from tirjax.rundir import RunDir

TRAINER = "experiments.train"


def train_command(config: str, workdir: str, overrides: Sequence[str] = ()) -> list[str]:
  """The trainer's argv: this interpreter, `--config`, the overrides in order, `--workdir`.

  Raises:
    ValueError: an override that is not `--config.<key>=<value>`, or an empty config or workdir.
  """
  if not config or not workdir:
    raise ValueError(f"config and workdir: both needed, got config={config!r}, "
                     f"workdir={workdir!r}")
  bad = [o for o in overrides if not (o.startswith("--config.") and "=" in o)]
  if bad:
    raise ValueError(f"overrides: each must be --config.<key>=<value>, got {bad}")
  return [sys.executable, "-m", TRAINER, f"--config={config}", *overrides,
          f"--workdir={workdir}"]


@dataclasses.dataclass(frozen=True)
class Launched:
  """A trainer process that ran to the end: its run directory, argv and wall seconds."""

  files: RunDir
  command: tuple[str, ...]
  wall_s: float


def train(config: str, workdir: str, overrides: Sequence[str] = ()) -> Launched:
  """Runs (or resumes) one training run in its own process and waits for it.

  Raises:
    subprocess.CalledProcessError: the trainer exited with an error (its status.json says why).
  """
  command = train_command(config, workdir, overrides)
  start = time.perf_counter()
  subprocess.run(command, check=True)
  return Launched(RunDir(workdir), tuple(command), time.perf_counter() - start)
