"""The trainer end to end: a two-step smoke run of every config, and resume after SIGKILL."""

import json
import math
import os
import re
import subprocess

import numpy as np
import pytest
from safetensors.numpy import load_file

from tirjax.trainer.train import run
from tirjax.env.toolworld.failures import KINDS as FAILURE_KINDS
from tirjax.rundir import RunDir
from tirjax.testing.short_runs import (CONFIGS, SFT_THEN_RL, committed, kill_when, logged,
                                      short_config, train_command)


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIGS)
def test_two_step_smoke_run(name, tmp_path):
  # hidifftir also runs the mini-batch updates (2 passes × 2 mini-batches), the tempered
  # policy (π_old recomputed at T = 0.8) and the sampled evaluation (pass@k) through the whole
  # trainer.
  extra = {"sft.steps": 2, "sft.batch_size": 2, "train.queries_per_step": 2,
           "train.mini_batch_queries": 1, "train.ppo_epochs": 2, "sampler.eval_samples": 2,
           "rollout.temperature": 0.8, "train.tempered_policy": True, "train.eval_every": 1,
           "train.eval_subset": 1} if name == "hidifftir" else {}
  summary = run(short_config(name, **extra), str(tmp_path))
  status = json.load(open(tmp_path / "status.json"))
  assert status["state"] == "finished"
  records = RunDir(str(tmp_path)).metrics()
  rl = [r for r in records if r["phase"] == "rl"]
  assert [r["step"] for r in rl] == [1, 2]
  for r in records:
    for k, v in r.items():
      if isinstance(v, float):
        assert math.isfinite(v), (k, v)
  assert "loss/loss" in rl[0] and "unlearning/rate" in rl[0] and "reward/mean" in rl[0]
  assert os.listdir(tmp_path / "checkpoints")
  assert (tmp_path / "hf_export" / "config.json").exists()
  assert set(summary) >= {"after_sft", "after_rl"}
  assert 0 <= summary["after_rl"]["eval/accuracy"] <= 1
  assert all(r["updates/count"] == (4 if name == "hidifftir" else 1) for r in rl)
  # π_old recomputed by the trainer (hidifftir: tempered policy): no sampler gap to log; nor
  # where the update had no token to compare (DAPO's filter can drop every group of a step)
  assert all(("sampler/logprob_gap_max" in r)
             == (name != "hidifftir" and r["loss/metrics/ratio/count"] > 0) for r in rl)
  assert 0 <= rl[0]["groups/mixed_share"] <= 1
  assert all(0 <= r["credit/no_signal"] <= 1 for r in rl)  # toolworld: turns labelled
  if name == "hidifftir":
    assert [r["step"] for r in records if r["phase"] == "sft"] == [1, 2]
    # eval_subset: the evaluation between the first and the last is on the subset only
    evals = {r["step"]: r for r in records if r["phase"] == "eval"}
    assert sorted(evals) == [0, 1, 2] and "eval/accuracy" not in evals[1]
    assert all("eval/subset/accuracy" in evals[s] for s in evals)
    assert "eval/accuracy" in evals[0] and "eval/accuracy" in evals[2]
    for stage in ("after_sft", "after_rl"):
      m = summary[stage]
      assert 0 <= m["eval/pass@1"] <= m["eval/pass@2"] <= 1
      assert m["eval/sampled_all_wrong"] + m["eval/sampled_mixed"] + m["eval/sampled_all_right"] \
          == pytest.approx(1.0)
      assert "eval/pass@4" not in summary[stage]  # k <= the 2 samples only
      # toolworld: every sample is right or failed first by one kind (toolworld.failures)
      failures = {k: v for k, v in m.items() if k.startswith("eval/failure/")}
      assert len(failures) == len(FAILURE_KINDS)
      assert sum(failures.values()) + m["eval/sampled_accuracy"] == pytest.approx(1.0)
    assert (tmp_path / "reference").exists()  # the KL reference, kept for restarts


@pytest.mark.slow
def test_tempered_policy_first_update_has_ratio_one(tmp_path):
  """Issue 42: on the tempered policy (`train.tempered_policy`) the trainer recomputes π_old
  at the step's temperature (the samplers report the raw model's log-probs), so a step's
  one update starts at π_old = π: ρ = 1 on every token. π_old left as the sampler's is the
  untempered policy, and ρ spreads (std 0.06 at T = 0.8)."""
  run(short_config("hidifftir", steps=1, **{
      "rollout.temperature": 0.8, "train.tempered_policy": True, "env.eval_tasks": 1,
      "train.export_final": False}), str(tmp_path))
  [rl] = RunDir(str(tmp_path)).metrics("rl")
  assert rl["updates/count"] == 1 and rl["loss/metrics/ratio/count"] > 0
  for key in ("min", "max", "mean"):
    assert rl[f"loss/metrics/ratio/{key}"] == pytest.approx(1.0, abs=1e-6), key
  assert rl["loss/metrics/ratio/std"] <= 1e-6


def _final_params(workdir):
  return load_file(os.path.join(workdir, "hf_export", "model.safetensors"))


@pytest.mark.slow
def test_resume_after_sigkill_equals_an_uninterrupted_run(tmp_path):
  steps = 4
  env = {**os.environ, "PYTHONPATH": os.getcwd()}
  full, killed = tmp_path / "full", tmp_path / "killed"
  subprocess.run(train_command(full, steps), check=True, env=env, capture_output=True)
  # Kill at a step chosen at random (seeded), once its checkpoint exists.
  kill_after = int(np.random.default_rng(0).integers(1, steps))
  kill_when(train_command(killed, steps), env, logged(killed, "rl", kill_after),
            tmp_path / "killed.log", f"RL step {kill_after}")
  assert json.load(open(killed / "status.json"))["state"] == "running"  # killed, not finished
  subprocess.run(train_command(killed, steps), check=True, env=env, capture_output=True)
  a, b = _final_params(full), _final_params(killed)
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  rl = [r["step"] for r in RunDir(str(killed)).metrics() if r["phase"] == "rl"]
  assert rl == list(range(1, steps + 1))  # steps redone after the kill are logged once


@pytest.mark.slow
def test_resume_after_sft_warm_start_kills_in_sft_and_in_rl(tmp_path):
  """Issue 14: one monotonic checkpoint step over SFT then RL. Killed once a random SFT step's
  checkpoint is committed (issue 30: it then resumes from that checkpoint, inside SFT) and
  then at a random RL step (seeded), the run ends with the uninterrupted run's parameters bit
  for bit, logs every row once, and a finished run rerun only re-evaluates."""
  steps = 4
  env = {**os.environ, "PYTHONPATH": os.getcwd()}
  extra = [f"--config.{k}={v}" for k, v in SFT_THEN_RL.items()]
  full, killed = tmp_path / "full", tmp_path / "killed"
  subprocess.run(train_command(full, steps) + extra, check=True, env=env, capture_output=True)
  rng = np.random.default_rng(7)
  sft_kill, rl_kill = int(rng.integers(1, SFT_THEN_RL["sft.steps"])), int(rng.integers(1, steps))
  kill_when(train_command(killed, steps) + extra, env, committed(killed, sft_kill),
            tmp_path / "first.log", f"SFT checkpoint {sft_kill}")
  kill_when(train_command(killed, steps) + extra, env, logged(killed, "rl", rl_kill),
            tmp_path / "second.log", f"RL step {rl_kill}")
  resumed = (tmp_path / "second.log").read_text()
  at = [int(x) for x in re.findall(rf"resumed {re.escape(str(killed))} at sft step (\d+)",
                                   resumed)]
  assert len(at) == 1 and sft_kill <= at[0] < SFT_THEN_RL["sft.steps"], resumed
  assert json.load(open(killed / "status.json"))["state"] == "running"  # killed, not finished
  subprocess.run(train_command(killed, steps) + extra, check=True, env=env, capture_output=True)
  a, b = _final_params(full), _final_params(killed)
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  rows = [(r["phase"], r["step"]) for r in RunDir(str(killed)).metrics()]
  assert len(rows) == len(set(rows)), "a metrics row is logged twice"
  assert [s for p, s in rows if p == "sft"] == list(range(1, SFT_THEN_RL["sft.steps"] + 1))
  assert [s for p, s in rows if p == "rl"] == list(range(1, steps + 1))
  saved = sorted(int(d) for d in os.listdir(killed / "checkpoints") if d.isdigit())
  assert saved and saved[-1] == SFT_THEN_RL["sft.steps"] + steps  # RL's steps follow SFT's
  # A finished run, rerun: it evaluates again and trains nothing.
  before = RunDir(str(killed)).metrics()
  out = subprocess.run(train_command(killed, steps) + extra, check=True, env=env,
                       capture_output=True, text=True)
  assert RunDir(str(killed)).metrics() == before
  assert "eval accuracy" in out.stdout
  c = _final_params(killed)
  for k in a:
    np.testing.assert_array_equal(a[k], c[k], err_msg=k)
  # Its latest checkpoint corrupted (one flipped byte), the rerun names it, moves it aside,
  # redoes the last step from the one before and ends with the same parameters.
  latest = killed / "checkpoints" / str(saved[-1])
  data = max((p for p in latest.rglob("*") if p.is_file() and "ocdbt" in str(p.parent)),
             key=lambda p: p.stat().st_size)
  raw = bytearray(data.read_bytes())
  raw[len(raw) // 2] ^= 0xFF
  data.write_bytes(bytes(raw))
  out = subprocess.run(train_command(killed, steps) + extra, check=True, env=env,
                       capture_output=True, text=True)
  assert f"{latest}: checksum mismatch" in out.stderr
  assert (killed / "checkpoints" / f"corrupt-{saved[-1]}").is_dir()
  assert [s for p, s in [(r["phase"], r["step"]) for r in RunDir(str(killed)).metrics()]
          if p == "rl"] == list(range(1, steps + 1))
  d = _final_params(killed)
  for k in a:
    np.testing.assert_array_equal(a[k], d[k], err_msg=k)
