"""A run with a critic (issue 53: `ppo`), killed at each checkpoint from the hand-over to RL on
and started again, ends where the uninterrupted run ends: the same metrics and, bit for bit,
the same policy, critic and optimizer states (their SHA-256 sums in the last checkpoint)."""

import os
import subprocess

import pytest

from tirjax.rundir import RunDir
from tirjax.testing.short_runs import (SFT_THEN_RL, checkpoint_steps, config_command,
                                      kill_at_every_checkpoint, last_meta, timeless)

RL_STEPS = 2
# SFT, then RL whose first step is the critic's warm-up (the policy waits) and whose second
# updates both; the packed default for the policy.
EXTRA = {**SFT_THEN_RL, "sft.steps": 2, "critic.critic_warmup": 1, "train.keep_checkpoints": 20}


def command(workdir):
  return config_command(f"configs/ppo.py:model=tiny,steps={RL_STEPS}", workdir, EXTRA)


@pytest.mark.slow
def test_a_run_with_a_critic_resumes_bit_exact(tmp_path):
  env = {**os.environ, "PYTHONPATH": os.getcwd()}
  full, killed = tmp_path / "full", tmp_path / "killed"
  subprocess.run(command(full), check=True, env=env, capture_output=True)
  saved = checkpoint_steps(full)
  assert len(saved) == EXTRA["sft.steps"] + RL_STEPS  # SFT step 1, the hand-over, each RL step
  rl = [r for r in RunDir(str(full)).metrics() if r["phase"] == "rl"]
  # the warm-up step updates the critic only; the next both
  assert [r["updates/count"] for r in rl] == [0.0, 1.0]
  assert all("critic/loss" in r and "critic/explained_variance" in r for r in rl)
  meta = last_meta(full)
  assert meta["critic"] is True and meta["policy_version"] == 1
  critic_sums = {k: v for k, v in meta["sums"].items() if k.startswith("['critic']")}
  assert critic_sums
  # the critic's packed passes (values, update) record their layouts like the policy's
  assert {"rl", "values", "critic_update"} <= set(meta["data_position"]["packed_shapes"])
  # killed once each checkpoint from the hand-over to RL on is committed, then finished
  kill_at_every_checkpoint(lambda w: [command(w)], killed, saved[1:], env)
  subprocess.run(command(killed), check=True, env=env, capture_output=True)
  assert timeless(RunDir(str(full)).metrics()) == timeless(RunDir(str(killed)).metrics())
  assert last_meta(killed)["sums"] == meta["sums"]  # policy, critic and optimizers, bit for bit
