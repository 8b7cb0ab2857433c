"""Short trainer runs for the end-to-end tests: every config's name, the short settings, the
trainer's command line, and waits on a run's observable state (metrics logged, checkpoint
committed) to kill it at."""

import importlib
import pathlib
import signal
import subprocess
import time

import configs
from tirjax.config import set_key
from tirjax.reporting import launch
from tirjax import rundir
from tirjax.rundir import RunDir

# Resolved from the package, not the working directory, so that the list does not depend on
# where the tests are started from.
CONFIGS = sorted(p.stem for p in pathlib.Path(configs.__file__).parent.glob("*.py")
                 if p.stem not in ("__init__", "base", "ablate", "cell"))

# Short settings: no SFT, one query per step, two steps of at most 16 tokens, tiny evaluation.
SHORT = {
    "sft.steps": 0, "env.eval_tasks": 2, "train.queries_per_step": 1, "train.eval_every": 2,
    "train.checkpoint_every": 1, "train.progress_bar": False, "train.dynamic_sampling_tries": 1,
    "rollout.n": 2, "rollout.max_steps": 2, "rollout.max_new_tokens": 16,
    "rollout.shapes.max_steps": 2, "rollout.shapes.max_tokens": 256,
    "rollout.arpo.initial_rollouts": 2, "rollout.arpo.total_rollouts": 3,
    "sharding.num_devices": 1,
    # one update per step at T = 1 on the raw model (the tiny toolworld default tempers at 0.6
    # in mini-batches of 2 queries; the hidifftir smoke run of tests/test_train_runs.py covers
    # that path)
    "train.mini_batch_queries": 0, "rollout.temperature": 1.0, "train.tempered_policy": False,
}

# SFT before RL, long enough to kill a run inside SFT.
SFT_THEN_RL = {"sft.steps": 4, "sft.batch_size": 2, "sft.num_demos": 8}


def short_config(name, steps=2, **extra):
  """Config `name` on the tiny model for `steps` RL steps, with `SHORT` and then `extra` set."""
  c = importlib.import_module(f"configs.{name}").get_config(f"model=tiny,steps={steps}")
  for key, value in {**SHORT, **extra}.items():
    set_key(c, key, value)
  return c


def train_command(workdir, steps):
  """The trainer's command line for grpo on the tiny model with `SHORT` (run from the repo)."""
  return launch.train_command(
      f"configs/grpo.py:model=tiny,steps={steps}", str(workdir),
      [f"--config.{k}={v}" for k, v in SHORT.items() if not k.startswith("rollout.arpo")])


def kill_when(command, env, ready, log, what):
  """Starts `command` (its stdout to `log`) and SIGKILLs it once `ready()` holds (an observable
  state, not a fixed sleep)."""
  with open(log, "w") as out:
    proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.DEVNULL)
  deadline = time.time() + 600
  while not ready():
    assert time.time() < deadline and proc.poll() is None, f"the run ended before {what}"
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()


def logged(workdir, phase, step):
  """Whether `phase` step `step` is in the run's metrics (a line being written is not yet)."""
  def ready():
    try:
      return any(r["step"] >= step for r in RunDir(str(workdir)).metrics(phase))
    except (OSError, ValueError):
      return False
  return ready


def committed(workdir, step):
  """Whether checkpoint `step` is committed (Orbax renames it into place once written)."""
  return lambda: (pathlib.Path(workdir) / rundir.CHECKPOINTS / str(step)).is_dir()
