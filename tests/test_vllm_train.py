"""The trainer with `sampler.kind="vllm"`: two RL steps of GRPO on toolworld, sampled by vLLM.

The run attaches to the session's toolworld server (`sampler.vllm_url`; same architecture: the
`tiny` model over the toolworld vocabulary with vLLM's head size) and hands its own weights
over before every sampling phase, each hand-over checked against its teacher-forced log-probs.
"""

import json
import math
import os

import pytest

from configs import grpo
from experiments import train
from tests.vllm_toolworld import TOL

pytest_plugins = ["tests.vllm_toolworld_fixtures"]
pytestmark = pytest.mark.xdist_group("vllm")


def test_two_rl_steps_with_vllm_finish_with_finite_metrics(toolworld, tmp_path):
  # Two rows per batch: the devices (8 in tests) go to the tensor axis, not the batch axes.
  config = grpo.get_config("model=tiny,sampler=vllm,steps=2,mesh=1x1x-1")
  config.sampler.vllm_url = toolworld.sampler.url
  config.sft.steps = 0
  config.env.eval_tasks = 4
  config.train.queries_per_step = 1
  config.train.progress_bar = False
  config.rollout.n = 2
  config.rollout.max_steps = 2
  config.rollout.shapes.max_steps = 2
  config.rollout.max_new_tokens = 32
  workdir = str(tmp_path / "run")
  summary = train.run(config, workdir)
  assert summary["policy_version"] == 2 and summary["rl_steps"] == 2
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f]
  rl = [r for r in records if r["phase"] == "rl"]
  assert [r["step"] for r in rl] == [1, 2]
  for r in rl:
    numbers = {k: v for k, v in r.items() if isinstance(v, (int, float))}
    assert all(math.isfinite(v) for v in numbers.values()), numbers
    # Trainer vs vLLM log-probs of the sampled tokens, from the first update's ratio.
    assert 0 <= r["sampler/logprob_gap_max"] < TOL
    assert r["rollout/sampled_tokens"] > 0
  # Hand-overs alternate between two export folders.
  assert sorted(os.listdir(os.path.join(workdir, "vllm_weights"))) == ["slot0", "slot1"]
  with open(os.path.join(workdir, "status.json")) as f:
    assert json.load(f)["state"] == "finished"
