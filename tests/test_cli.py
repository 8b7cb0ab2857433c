"""Errors a user reads (issue 41): a config, data or command-line error of an entry point is
printed alone on stderr with exit status 1, never below a page of usage text or a traceback."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args):
  return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                        timeout=300, env={**os.environ, "PYTHONPATH": ROOT})


def alone(proc, message):
  """The error is `message`, on stderr, alone: no usage text, no traceback, nothing on stdout."""
  assert proc.returncode == 1, proc
  assert proc.stdout == "", proc.stdout
  lines = [line for line in proc.stderr.splitlines()
           if line.strip() and not line.startswith(("WARNING:", "I0", "W0"))]
  assert lines == [message], proc.stderr
  assert "Traceback" not in proc.stderr and "flags:" not in proc.stderr


def test_a_config_or_data_error_is_printed_alone(tmp_path):
  missing = str(tmp_path / "nothing")
  alone(run("-m", "experiments.evaluate", "--config=configs/hidifftir.py:env=toolhop",
            f"--policy={missing}", f"--out={tmp_path / 'out'}"),
        f"evaluate: policy: {missing!r} is not a directory")
  alone(run("-m", "experiments.train", "--config=configs/grpo.py:model=tiny,env=toolhop",
            f"--config.env.data_path={missing}", "--config.model.hf_checkpoint=.",
            "--config.sft.steps=0", f"--workdir={tmp_path / 'run'}"),
        f"train: env.data_path: {missing!r} does not exist (env.name=toolhop)")
  assert not os.path.exists(tmp_path / "run")  # refused before anything is written


def test_a_refused_command_line_is_one_message_not_the_usage_page(tmp_path):
  alone(run("-m", "experiments.report", str(tmp_path), f"--out={tmp_path / 'report'}"),
        f"report: {tmp_path}: no run directory (no cell.json) found")
  proc = run("-m", "experiments.train", "--config=configs/grpo.py:model=tiny",
             "--config.rollout.nn=3", f"--workdir={tmp_path / 'run'}")
  alone(proc, "FATAL Flags parsing error: a --config override was refused (AttributeError: "
              "\"'nn'\"); the overrides given: --config.rollout.nn; each must name a key of the "
              "config, with a value of its type")
