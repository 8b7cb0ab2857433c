"""`tirjax.reporting.launch`: the trainer's command line, and a tiny run launched and read
back through `rundir.RunDir` (the scripts that train through it: abstention_check,
bench_default_run, bench_rl_step; experiments.ablate builds its command with it)."""

import os
import subprocess
import sys

import pytest

from tirjax.reporting import launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A one-step run of the tiny model: no SFT, one RL step of one query, two eval tasks.
TINY = ["--config.sft.steps=0", "--config.env.eval_tasks=2",
        "--config.train.queries_per_step=1", "--config.train.mini_batch_queries=0",
        "--config.rollout.n=2", "--config.rollout.max_steps=2",
        "--config.rollout.max_new_tokens=16", "--config.rollout.shapes.max_steps=2",
        "--config.rollout.shapes.max_tokens=256", "--config.train.export_final=False",
        "--config.train.progress_bar=False", "--config.sharding.num_devices=1"]


def test_the_command_puts_the_overrides_between_config_and_workdir():
  assert launch.train_command("configs/grpo.py:model=tiny", "runs/x",
                              ["--config.seed=3", "--config.train.steps=2"]) == [
      sys.executable, "-m", "experiments.train", "--config=configs/grpo.py:model=tiny",
      "--config.seed=3", "--config.train.steps=2", "--workdir=runs/x"]
  assert launch.train_command("c.py", "w") == [sys.executable, "-m", "experiments.train",
                                               "--config=c.py", "--workdir=w"]


@pytest.mark.parametrize("overrides", [["--workdir=elsewhere"], ["--config.seed", "3"],
                                       ["config.seed=3"]])
def test_an_override_that_is_not_a_config_key_is_refused_by_name(overrides):
  with pytest.raises(ValueError, match="--config.<key>=<value>, got") as e:
    launch.train_command("configs/grpo.py", "runs/x", overrides)
  assert repr(overrides[0]) in str(e.value)


def test_a_config_and_a_workdir_are_needed():
  with pytest.raises(ValueError, match="workdir=''"):
    launch.train_command("configs/grpo.py", "")


@pytest.mark.slow
def test_a_tiny_run_is_launched_and_read_back(tmp_path, monkeypatch):
  monkeypatch.chdir(ROOT)  # the config path is relative, as in the scripts
  workdir = str(tmp_path / "run")
  run = launch.train("configs/grpo.py:model=tiny,steps=1", workdir,
                     [*TINY, "--config.seed=3"])
  assert run.command[-1] == f"--workdir={workdir}" and run.wall_s > 0
  assert run.files.path == workdir and run.files.state() == "finished"
  assert run.files.config()["seed"] == 3 and run.files.config()["train"]["steps"] == 1
  assert [x["step"] for x in run.files.metrics("rl")] == [1]
  assert run.files.metrics("sft") == []
  summary = run.files.summary()
  assert summary["rl_steps"] == 1
  assert summary["after_sft"] == run.files.eval_after_sft()
  assert 0 <= summary["after_rl"]["eval/accuracy"] <= 1
  # a trainer that fails (here: an unknown key, refused before any compute) raises
  with pytest.raises(subprocess.CalledProcessError):
    launch.train("configs/grpo.py:model=tiny", str(tmp_path / "bad"),
                 ["--config.train.no_such_key=1"])
