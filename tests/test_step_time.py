"""The step-time model (tirjax.reporting.step_time): its counts and times follow from the named
constants, and it refuses what cannot run."""

import subprocess
import sys
import os

import pytest

from tirjax.reporting import step_time as st
from tirjax.models import config as model_config
from tirjax.models import decoder
from tirjax.train_steps import flops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_counts_and_times_follow_the_constants():
  w = st.Workload(model="qwen3_1p7b", queries=4, rows=2, context=1000, prompt_fraction=0.1,
                  tool_fraction=0.3, kl=False)
  chip = st.CHIPS["h200"]
  r = st.estimate(w, chip, chips=2)
  cfg = model_config.preset("qwen3_1p7b")
  params = decoder.num_params(decoder.abstract(cfg))
  assert (r["tokens_sampled"], r["tokens_prefilled"], r["tokens_trained"]) == (
      8 * 600, 4 * 100 + 8 * 300, 8 * 1000)
  train = 8 * 1000 * flops.train_flops_per_token(cfg, 500)
  assert r["train_flops"] == train
  assert r["seconds"]["train"] == pytest.approx(train / (2 * chip.peak_flops * st.TRAIN_MFU))
  assert r["handover_bytes"] == 2 * params
  assert r["seconds"]["handover"] == pytest.approx(2 * params / st.HANDOVER_BYTES_PER_S)
  s = r["seconds"]
  assert s["step"] == pytest.approx(s["sample"] + s["train"] + s["handover"])
  # The KL reference adds a forward pass (a third of a training token's FLOPs).
  with_kl = st.estimate(st.Workload(**{**w.__dict__, "kl": True}), chip, chips=2)
  assert with_kl["train_flops"] == pytest.approx(train * 4 / 3)
  # Twice the chips: training halves; more rows: more sampled tokens.
  assert st.estimate(w, chip, 4)["seconds"]["train"] == pytest.approx(s["train"] / 2)


@pytest.mark.parametrize("model, rows, chips", [("qwen3_1p7b", 16, 8), ("qwen3_8b", 8, 4),
                                                ("qwen3_1p7b", 2, 2)])
def test_the_async_step_is_the_best_split_of_sampling_beside_training(model, rows, chips):
  """k >= 1: over every split (s sampler chips, the rest the learner's), the step is
  max(sample(s), train(rest)) + hand-over; the chosen split's is the smallest, and it is never
  longer than sampling alone or training alone on its own chips plus the hand-over."""
  w, chip = st.Workload(model=model, rows=rows, queries=32, context=4096), st.CHIPS["h200"]
  a = st.async_estimate(w, chip, chips)
  steps = {}
  for s in range(1, chips):
    sampled = st.estimate(w, chip, s)["seconds"]
    trained = st.estimate(w, chip, chips - s)["seconds"]
    steps[s] = max(sampled["sample"], trained["train"]) + sampled["handover"]
  assert a["sampler_chips"] + a["trainer_chips"] == chips
  assert a["seconds"]["step"] == pytest.approx(min(steps.values()))
  assert a["seconds"]["step"] == pytest.approx(steps[a["sampler_chips"]])
  s = a["seconds"]
  assert s["step"] == pytest.approx(max(s["sample"], s["train"]) + s["handover"])
  sync = st.estimate(w, chip, chips)["seconds"]["step"]
  assert a["speedup"] == pytest.approx(sync / s["step"])
  with pytest.raises(ValueError, match="chips: an asynchronous step needs >= 2"):
    st.async_estimate(w, chip, 1)


def test_what_cannot_run_is_refused_by_name():
  with pytest.raises(ValueError, match="context: must be >= 1"):
    st.Workload(context=0)
  with pytest.raises(ValueError, match="prompt_fraction, tool_fraction"):
    st.Workload(prompt_fraction=0.6, tool_fraction=0.5)
  with pytest.raises(ValueError, match="chips: must be >= 1"):
    st.estimate(st.Workload(), st.CHIPS["h200"], chips=0)
  tiny_chip = st.Chip("a small chip", 1e12, 1e11, 1e9, "test")
  with pytest.raises(ValueError, match="do not fit"):
    st.estimate(st.Workload(model="qwen3_8b"), tiny_chip, chips=1)


def test_the_command_prints_the_papers_table():
  proc = subprocess.run([sys.executable, "-m", "experiments.studies.step_time"], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.count("| qwen3_") == 16 and "Constants:" in proc.stdout
