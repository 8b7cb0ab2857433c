"""Short trainer runs for the end-to-end tests: every config's name, the short settings, the
trainer's command line, and waits on a run's observable state (metrics logged, checkpoint
committed) to kill it at."""

import json
import pathlib
import signal
import subprocess
import time

import configs
from configs import estimator
from tirjax import advantages
from tirjax.config import set_key
from tirjax.reporting import launch
from tirjax import rundir
from tirjax.rundir import RunDir

# Every registered estimator has a config: its own configs/<name>.py or the generic
# configs/estimator.py (`config`); those that read a critic's values (ppo, turn_ppo) train one
# beside the policy (`tirjax.train_steps.critic`).
CONFIGS = tuple(advantages.names())
# The config files of estimators (configs/<name>.py), resolved from the package, not the working
# directory, so that the list does not depend on where the tests are started from.
CONFIG_FILES = sorted(p.stem for p in pathlib.Path(configs.__file__).parent.glob("*.py")
                      if p.stem not in ("__init__", "base", "ablate", "cell", "estimator"))


def config(name: str, arg: str | None = None):
  """The config of estimator `name` with presets `arg`, as `configs/estimator.py:<name>,<arg>`
  builds it (its own file's where it has one)."""
  return estimator.get_config(",".join(filter(None, (name, arg))))


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
  c = config(name, f"model=tiny,steps={steps}")
  for key, value in {**SHORT, **extra}.items():
    set_key(c, key, value)
  return c


def train_command(workdir, steps):
  """The trainer's command line for grpo on the tiny model with `SHORT` (run from the repo)."""
  return config_command(f"configs/grpo.py:model=tiny,steps={steps}", workdir)


def config_command(config_arg: str, workdir, extra=None):
  """The trainer's command line for `config_arg` (a `--config` value) with `SHORT`, then
  `extra`, set (run from the repo)."""
  flags = {**{k: v for k, v in SHORT.items() if not k.startswith("rollout.arpo")},
           **(extra or {})}
  return launch.train_command(config_arg, str(workdir),
                              [f"--config.{k}={v}" for k, v in flags.items()])


def killed_at(command, step):
  """Trainer argv `command` run by `tirjax.testing.killed_run`, which SIGKILLs the process
  once checkpoint `step` is committed."""
  assert command[1:3] == ["-m", launch.TRAINER], command
  return [command[0], "-m", "tirjax.testing.killed_run", str(step), *command[3:]]


def checkpoint_steps(workdir):
  """The committed checkpoint steps of a run directory, ascending."""
  return sorted(int(d.name) for d in (pathlib.Path(workdir) / rundir.CHECKPOINTS).iterdir()
                if d.name.isdigit())


def last_meta(workdir):
  """The metadata (data position, SHA-256 sums of the saved states) of the run's last
  checkpoint."""
  step = checkpoint_steps(workdir)[-1]
  return json.loads((pathlib.Path(workdir) / rundir.CHECKPOINTS / str(step) / "meta"
                     / "metadata").read_text())


def timeless(records):
  """A run's metrics rows without their wall times (which no two runs share)."""
  return [{k: v for k, v in r.items() if not (k.startswith("time") or k.endswith("_s"))}
          for r in records]


def kill_at_every_checkpoint(commands, workdir, steps, env, log=None):
  """Runs `commands(workdir)` (one trainer argv per process, each started with `env`) once per
  checkpoint of `steps`, each start SIGKILLed by itself once that checkpoint is committed, so
  every run but the first resumes from the checkpoint before; returns each start's stdout
  (process 0's). A process left when another has died (a collective's partner gone) is
  killed too."""
  outputs = []
  env = {**env, "PYTHONUNBUFFERED": "1"}  # what a killed process printed is not lost
  for step in steps:
    procs = []
    for p, command in enumerate(commands(workdir)):
      out = open(f"{log or workdir}.{step}.p{p}.log", "w+")
      procs.append((subprocess.Popen(killed_at(command, step), env=env, stdout=out,
                                     stderr=subprocess.STDOUT), out))
    deadline = time.time() + 600
    while all(proc.poll() is None for proc, _ in procs):
      assert time.time() < deadline, f"no process died at checkpoint {step}"
      time.sleep(0.05)
    for proc, _ in procs:
      try:
        proc.wait(timeout=60)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    texts = []
    for proc, out in procs:
      out.seek(0)
      texts.append(out.read())
      out.close()
    codes = [proc.returncode for proc, _ in procs]
    assert codes[0] == -signal.SIGKILL, f"checkpoint {step}: exit codes {codes}\n{texts[0][-3000:]}"
    assert checkpoint_steps(workdir)[-1] == step, (step, checkpoint_steps(workdir))
    outputs.append(texts[0])
  return outputs


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
