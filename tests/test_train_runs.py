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
from tirjax.testing.short_runs import (CONFIGS, SFT_THEN_RL, checkpoint_steps,
                                      kill_at_every_checkpoint, short_config, train_command)


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


# The packed default with everything whose packed shapes a resume must carry: SFT, then RL in
# 2 mini-batches on the tempered policy (π_old recomputed, packed) with a KL reference
# (packed); every checkpoint kept, so that each one can be resumed from and compared.
EVERY_STEP = {**SFT_THEN_RL, "train.queries_per_step": 2, "train.mini_batch_queries": 1,
              "rollout.temperature": 0.8, "train.tempered_policy": True, "loss.kl_coef": 0.001,
              "train.keep_checkpoints": 20, "sft.steps": 3}
RL_STEPS = 2


def _same_records(a, b):
  """Two runs' metrics rows, equal but for wall times, bit for bit where they are floats."""
  timeless = lambda r: {k: v for k, v in r.items()
                        if not (k.startswith("time") or k.endswith("_s"))}  # seconds
  assert [(r["phase"], r["step"]) for r in a] == [(r["phase"], r["step"]) for r in b]
  for x, y in zip(a, b):
    assert timeless(x) == timeless(y), (x["phase"], x["step"])


@pytest.mark.slow
def test_resume_is_bit_exact_from_every_checkpoint(tmp_path):
  """Issue 52: killed (SIGKILL, by itself: `tirjax.testing.killed_run`) once each checkpoint of
  an SFT-then-RL run on the packed default is committed — every SFT step, the hand-over to RL,
  every RL step — and started again each time, the run logs what the uninterrupted run logs
  and ends with its parameters, bit for bit. Each start resumes from the checkpoint before
  (issue 30: inside SFT too), with the packed shapes that run had reached
  (`tirjax.trainer.layouts`). Then a finished run, rerun, only re-evaluates, and a corrupt
  last checkpoint is named, moved aside and redone."""
  env = {**os.environ, "PYTHONPATH": os.getcwd()}
  extra = [f"--config.{k}={v}" for k, v in EVERY_STEP.items()]
  command = lambda workdir: train_command(workdir, RL_STEPS) + extra
  full, killed = tmp_path / "full", tmp_path / "killed"
  subprocess.run(command(full), check=True, env=env, capture_output=True)
  saved = checkpoint_steps(full)
  sft = EVERY_STEP["sft.steps"]
  assert len(saved) == sft + RL_STEPS  # SFT steps 1..sft-1, the hand-over, each RL step
  outputs = kill_at_every_checkpoint(lambda w: [command(w)], killed, saved, env)
  # each start after the first resumed from the checkpoint before its own
  resumed = [("sft", j) for j in range(1, sft)] + [("rl", j) for j in range(RL_STEPS)]
  for (phase, step), out in zip(resumed, outputs[1:]):
    assert out.count("resumed ") == 1 and f"resumed {killed} at {phase} step {step} " in out, \
        out[-2000:]
  assert json.load(open(killed / "status.json"))["state"] == "running"  # killed, not finished
  subprocess.run(command(killed), check=True, env=env, capture_output=True)
  _same_records(RunDir(str(full)).metrics(), RunDir(str(killed)).metrics())
  a, b = _final_params(full), _final_params(killed)
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  steps = RL_STEPS
  assert checkpoint_steps(killed) == saved
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
