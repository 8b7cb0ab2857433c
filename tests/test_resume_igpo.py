"""A run with IGPO's answer probes (issue 54: `igpo`, spec §4.4), killed at each checkpoint from
the hand-over to RL on and started again, ends where the uninterrupted run ends: the same
metrics and, bit for bit, the same policy and optimizer states (their SHA-256 sums in the last
checkpoint). The probe pass packs with a packer of its own, whose sizes the checkpoint records
beside the policy's (`tirjax.trainer.layouts`)."""

import os
import subprocess

import pytest

from tirjax.rundir import RunDir
from tirjax.testing.short_runs import (SFT_THEN_RL, checkpoint_steps, config_command,
                                      kill_at_every_checkpoint, last_meta, timeless)

RL_STEPS = 3
# SFT, then RL on toolworld (tasks with gold answers, which igpo's probes score). Each turn
# index's information gains z-scored over 4 rows: in the query's pool (the default) the
# outcomes, all -1 on the tiny model, would swamp the gains, so no advantage would read the
# probes' bits.
EXTRA = {**SFT_THEN_RL, "sft.steps": 2, "env.name": "toolworld", "rollout.n": 4,
         "advantage.options.normalise": "turn_index", "train.keep_checkpoints": 20}


def command(workdir):
  return config_command(f"configs/estimator.py:igpo,model=tiny,steps={RL_STEPS}", workdir, EXTRA)


@pytest.mark.slow
def test_a_run_with_answer_probes_resumes_bit_exact(tmp_path):
  env = {**os.environ, "PYTHONPATH": os.getcwd()}
  full, killed = tmp_path / "full", tmp_path / "killed"
  subprocess.run(command(full), check=True, env=env, capture_output=True)
  saved = checkpoint_steps(full)
  assert len(saved) == EXTRA["sft.steps"] + RL_STEPS  # SFT step 1, the hand-over, each RL step
  rl = [r for r in RunDir(str(full)).metrics() if r["phase"] == "rl"]
  assert [r["updates/count"] for r in rl] == [1.0] * RL_STEPS
  # the probe pass records its layout beside the policy's
  assert {"rl", "answer_probe"} <= set(last_meta(full)["data_position"]["packed_shapes"])
  # killed once each checkpoint from the hand-over to RL on is committed, then finished
  kill_at_every_checkpoint(lambda w: [command(w)], killed, saved[1:], env)
  subprocess.run(command(killed), check=True, env=env, capture_output=True)
  assert timeless(RunDir(str(full)).metrics()) == timeless(RunDir(str(killed)).metrics())
  assert last_meta(killed)["sums"] == last_meta(full)["sums"]  # policy and optimizer, bit for bit
