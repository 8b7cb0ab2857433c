"""One policy step gives the same loss, gradients and updated parameters (1e-5, float32) on
every (data, fsdp, tensor) mesh of the 8 simulated devices, and places its outputs as
declared (parameters and optimizer moments by the logical rules, metrics replicated)."""

import numpy as np
import pytest

from tirjax.testing import train_setup as ts
from tirjax.testing.reference import train_step as ref
from tirjax import loss, sharding, train_steps

pytestmark = pytest.mark.slow  # left out of `make test-fast`

MESHES = [(1, 1, 1), (8, 1, 1), (2, 4, 1), (2, 2, 2)]
LOSS = loss.LossOptions(clip_high=0.28, dual_clip=3.0, kl_coef=0.05, entropy_coef=0.01)
# 16 rows in 2 micro-batches: 8 rows each, one per batch shard on the (8, 1, 1) mesh.
STEP = train_steps.StepOptions(num_microbatches=2, logprob_chunk_size=48)


@pytest.fixture(scope="module")
def batch():
  return ts.policy_batch(np.random.default_rng(1), rows=16, length=12, with_ref=True)


@pytest.fixture(scope="module")
def results(batch):
  out = {}
  for shape in MESHES:
    graphdef, _, tx, place, state = ts.setup(shape)
    step = train_steps.policy_step(graphdef, tx, place, LOSS, STEP)
    new, metrics = step(state, sharding.shard_batch(batch, place.mesh, place.rules))
    out[shape] = (place, new, metrics)
  return out


@pytest.mark.parametrize("shape", MESHES[1:])
def test_step_is_the_same_on_every_mesh(results, shape):
  _, want, want_metrics = results[(1, 1, 1)]
  _, got, metrics = results[shape]
  assert metrics.keys() == want_metrics.keys()
  for k in ("loss", "pg", "kl", "entropy", "grad_norm", "learning_rate", "tokens/loss"):
    np.testing.assert_allclose(float(metrics[k]), float(want_metrics[k]), rtol=1e-5, atol=1e-7,
                               err_msg=k)
  for got_tree, want_tree in [(got.opt_state[0].grads, want.opt_state[0].grads),
                              (got.params, want.params)]:
    for a, b in zip(ref.flatten(got_tree), ref.flatten(want_tree)):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("shape", MESHES)
def test_outputs_are_placed_as_declared(results, shape):
  place, new, metrics = results[shape]
  embed = new.params["embed"][...]  # [vocab, embed]: P("tensor", "fsdp")
  assert embed.sharding == place.params["embed"].get_value()
  _, fsdp, tensor = shape
  assert {s.data.shape for s in embed.addressable_shards} == {(ts.VOCAB // tensor,
                                                              32 // fsdp)}
  adam = new.opt_state[1][1].inner_state[0]
  assert adam.mu["embed"][...].sharding == embed.sharding
  for v in metrics.values():
    assert v.sharding.is_fully_replicated
    assert len(v.sharding.device_set) == int(np.prod(shape))
