"""The trainer with `sampler.kind="vllm"`: two RL steps of GRPO on toolworld, sampled by vLLM.

The run attaches to the session's toolworld server (`sampler.vllm_url`; same architecture: the
`tiny` model over the toolworld vocabulary with vLLM's head size) and hands its own weights
over before every sampling phase, each hand-over checked against its teacher-forced log-probs.
Settings are the trainer tests' short ones (`tirjax.testing.short_runs.short_config`).
"""

import json
import math
import os

import pytest

from tirjax.trainer.train import run
from tirjax.models import config as model_config
from tirjax.rundir import RunDir
from tirjax.testing.short_runs import short_config
from tirjax.testing.vllm_toolworld import TOL

pytestmark = pytest.mark.xdist_group("vllm")


def served_sizes() -> dict:
  """The served model's sizes (`vllm_toolworld`: `tiny()` with vLLM's head size) as
  `model.tiny` overrides: the trainer hands its weights to that architecture."""
  tiny = model_config.tiny()
  return {f"model.tiny.{k}": getattr(tiny, k)
          for k in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads")}


def test_two_rl_steps_with_vllm_finish_with_finite_metrics(toolworld, tmp_path):
  config = short_config("grpo", **{"sampler.kind": "vllm",
                                   "sampler.vllm_url": toolworld.sampler.url}, **served_sizes())
  summary = run(config, str(tmp_path))
  assert summary["policy_version"] == 2 and summary["rl_steps"] == 2
  rl = RunDir(str(tmp_path)).metrics("rl")
  assert [r["step"] for r in rl] == [1, 2]
  for r in rl:
    numbers = {k: v for k, v in r.items() if isinstance(v, (int, float))}
    assert all(math.isfinite(v) for v in numbers.values()), numbers
    # Trainer vs vLLM log-probs of the sampled tokens, from the first update's ratio.
    assert 0 <= r["sampler/logprob_gap_max"] < TOL
    assert r["rollout/sampled_tokens"] > 0
  # Hand-overs alternate between two export folders.
  assert sorted(os.listdir(tmp_path / "vllm_weights")) == ["slot0", "slot1"]
  with open(tmp_path / "status.json") as f:
    assert json.load(f)["state"] == "finished"
