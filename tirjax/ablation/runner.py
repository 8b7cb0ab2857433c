"""Running a planned grid: one process per run, resumable, N at a time, then the report.

Each run is a normal trainer run directory (`tirjax.rundir`). Before anything runs, every
directory is claimed for its config (a directory holding another config is an error, naming
the keys that differ) and gets its cell.json. Then:
  - a run whose status.json says "finished" (with the planned `train.steps`) is skipped;
  - any other run (new, "failed", or "running" after a kill) is started; the trainer resumes
    from its last checkpoint;
  - a run that needs a warm start waits for it, and is not run if it failed.
Each run's output goes to `<run>/train.log` (appended across attempts). One harness at a time
holds a grid's workdir (`.ablate.lock`).
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import signal
import subprocess
import sys
import time
from typing import Callable, Optional, Sequence, TextIO

from tirjax import reporting, rundir
from tirjax.ablation.grid import REPORT_DIR, GridError, Job, build_config
from tirjax.rundir import RunDir
from tirjax.trainer import resolve

FINISHED = "finished"
POLL_S = 0.2
INTERRUPT_GRACE_S = 60.0


@dataclasses.dataclass(frozen=True)
class Result:
  """What happened to a job: "finished", "failed", "skipped" (finished earlier) or "blocked"
  (its warm start did not finish)."""

  job: Job
  state: str
  seconds: float = 0.0
  error: Optional[str] = None


def _read_or_none(read: Callable[[], dict]) -> Optional[dict]:
  try:
    return read()
  except (OSError, ValueError):
    return None


def run_state(workdir: str) -> Optional[str]:
  """The state in `workdir`/status.json, or None without a readable one."""
  return RunDir(workdir).state()


def prepare(jobs: Sequence[Job]) -> list[bool]:
  """Claims every job's directory and writes its cell.json; returns which jobs need to run.

  Raises:
    GridError: a directory holds a run with another config (nothing has run yet).
  """
  todo = []
  for job in jobs:
    config = resolve.config_record(build_config(job.recipe))
    files = RunDir(job.workdir)
    old = _read_or_none(files.config)
    try:
      rundir.claim(job.workdir, config)
    except rundir.WorkdirMismatch as e:
      raise GridError(f"{job.name}: {e}") from None
    rundir.write_cell(job.workdir, job.cell_json())
    same_steps = old is not None and old["train"]["steps"] == config["train"]["steps"]
    todo.append(not (same_steps and files.state() == FINISHED))
  return todo


def child_env(workdir: str, parallel: int, compilation_cache: bool) -> dict:
  """The environment of the run processes. The user's own settings win."""
  env = dict(os.environ)
  if compilation_cache:  # runs of a grid compile the same programs: compile each once
    env.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.abspath(os.path.join(workdir, "jax_cache")))
    env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  if parallel > 1:  # on a GPU, each process would otherwise reserve 75% of its memory
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{0.9 / parallel:.3f}")
  return env


class _Lock:
  """An exclusive lock on the grid's workdir, so that two harnesses never run the same runs."""

  def __init__(self, workdir: str):
    os.makedirs(workdir, exist_ok=True)
    self._file = open(os.path.join(workdir, ".ablate.lock"), "w")
    try:
      fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      self._file.close()
      raise GridError(f"{workdir}: another experiments.ablate is running on this grid") from None

  def close(self) -> None:
    self._file.close()


def run_grid(jobs: Sequence[Job], workdir: str, command: Callable[[Job], list[str]],
             parallel: int = 1, compilation_cache: bool = True,
             out: Optional[TextIO] = None) -> list[Result]:
  """Runs the jobs that need it, `parallel` processes at a time; prints a line per job.

  Args:
    jobs: `grid.plan(...)`; a job waits for the one it `needs`, which must be among them.
    workdir: the grid's directory.
    command: the argv of the process that runs one job (in its directory).
    parallel: processes at a time (>= 1).
    compilation_cache: share JAX's persistent compilation cache across the processes.
    out: where progress lines go (default: stdout).

  Returns:
    One `Result` per job, in the order of `jobs`.
  """
  if parallel < 1:
    raise ValueError(f"parallel: must be >= 1, got {parallel}")
  lock = _Lock(workdir)
  try:
    todo = prepare(jobs)
    return _schedule(jobs, todo, command, parallel, child_env(workdir, parallel, compilation_cache),
                     out or sys.stdout)
  finally:
    lock.close()


def _line(out: TextIO, done: int, n: int, job: Job, text: str) -> None:
  """A progress line; `[done/n]` counts the jobs ended so far (finished, failed, skipped,
  blocked), not the job's index."""
  print(f"[{done}/{n}] {job.name}: {text}", file=out, flush=True)


def _schedule(jobs, todo, command, parallel, env, out) -> list[Result]:
  n = len(jobs)
  results: dict[int, Result] = {}
  state = {}  # workdir -> final state, for the jobs that need it
  warm = sum(j.estimator == "sft" for j in jobs)
  print(f"ablate: {n} runs ({warm} warm starts), {n - sum(todo)} finished earlier, "
        f"{sum(todo)} to run, {parallel} at a time; [k/n]: k jobs ended so far", file=out,
        flush=True)
  for i, job in enumerate(jobs):
    if not todo[i]:
      results[i] = Result(job, "skipped")
      state[job.workdir] = FINISHED
      _line(out, len(results), n, job, "finished earlier, skipped")
  pending = [i for i in range(n) if todo[i]]
  running: dict[int, tuple[subprocess.Popen, float]] = {}
  try:
    while pending or running:
      for i in list(pending):
        if len(running) >= parallel:
          break
        job = jobs[i]
        if job.needs is not None and job.needs not in state:
          continue  # its warm start has not finished yet
        pending.remove(i)
        if job.needs is not None and state[job.needs] != FINISHED:
          results[i] = Result(job, "blocked", error=f"warm start {job.needs} did not finish")
          state[job.workdir] = "blocked"
          _line(out, len(results), n, job, f"not run: its warm start {job.needs} did not finish")
          continue
        before = run_state(job.workdir)
        running[i] = (_start(job, command, env), time.monotonic())
        _line(out, len(results), n, job, "started" + (f" (was {before})" if before else "") +
              f", log {os.path.join(job.workdir, 'train.log')}")
      if pending and not running:  # nothing could start: their warm starts are not in `jobs`
        for i in pending:
          error = f"warm start {jobs[i].needs} is not in the grid"
          results[i] = Result(jobs[i], "blocked", error=error)
          _line(out, len(results), n, jobs[i], f"not run: its {error}")
        pending = []
      time.sleep(POLL_S if running else 0)
      for i, (proc, t0) in list(running.items()):
        if proc.poll() is None:
          continue
        del running[i]
        results[i] = _finish(jobs[i], proc.returncode, time.monotonic() - t0)
        state[jobs[i].workdir] = results[i].state
        r = results[i]
        _line(out, len(results), n, r.job, f"{r.state} in {r.seconds:.1f} s" +
              (f": {r.error} (see {os.path.join(r.job.workdir, 'train.log')})" if r.error else ""))
  except KeyboardInterrupt:
    _stop([proc for proc, _ in running.values()])
    raise
  return [results[i] for i in range(n)]


def _start(job: Job, command, env) -> subprocess.Popen:
  argv = command(job)
  log = open(os.path.join(job.workdir, "train.log"), "a")
  log.write(f"\n== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(argv)}\n")
  log.flush()
  try:  # its own session: a Ctrl-C reaches the harness only, which passes it on once (`_stop`)
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
  finally:
    log.close()  # the child holds its own descriptor


def _finish(job: Job, returncode: int, seconds: float) -> Result:
  status = _read_or_none(RunDir(job.workdir).status) or {}
  if returncode == 0 and status.get("state") == FINISHED:
    return Result(job, FINISHED, seconds)
  error = status.get("error") if status.get("state") == "failed" else None
  return Result(job, "failed", seconds, error or f"exit code {returncode}, status "
                f"{status.get('state')!r}")


def _stop(procs: list[subprocess.Popen]) -> None:
  """Interrupts the runs (they record "failed" and resume next time), then kills stragglers."""
  for proc in procs:
    if proc.poll() is None:
      proc.send_signal(signal.SIGINT)
  deadline = time.monotonic() + INTERRUPT_GRACE_S
  for proc in procs:
    try:
      proc.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()


def write_report(jobs: Sequence[Job], workdir: str, baseline: str, last_rl: int,
                 title: str) -> dict[str, str]:
  """The report of the grid's run directories in `workdir`/report (`tirjax.reporting`)."""
  study = reporting.load_run_dirs([job.workdir for job in jobs], last_rl=last_rl,
                                  baseline=baseline)
  return reporting.write_report(study, os.path.join(workdir, REPORT_DIR), title)
