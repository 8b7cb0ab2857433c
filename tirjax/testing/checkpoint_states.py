"""Checkpoint test states: a tiny decoder's train state, an abstract target to restore it
into (on one device or a mesh), and an exact comparison of a restored state with the saved one."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from tirjax import checkpoint as ck
from tirjax import sharding
from tirjax.models import config, decoder


def make_state(step, mesh=None, seed=0):
  """A tiny decoder's TrainState at `step`, one Adam update in, optionally sharded on `mesh`."""
  model = decoder.init(config.tiny(vocab_size=64), seed=seed)
  if mesh is not None:
    sharding.shard_model(model, mesh)
  params = nnx.state(model, nnx.Param)
  opt_state = optax.adam(1e-3).init(params)
  # A non-trivial optimizer state: one update step.
  _, opt_state = optax.adam(1e-3).update(jax.tree.map(jnp.ones_like, params), opt_state, params)
  return ck.TrainState(step=step, params=params, opt_state=opt_state,
                       rng=jax.random.key(100 + step), data_position={"epoch": 1, "index": step},
                       policy_version=step // 2)


def target_like(state, mesh=None):
  """An abstract TrainState: with `mesh`, params and optimizer moments placed by the rules;
  without, everything on the first device."""
  rules = sharding.DEFAULT_RULES

  def abstract(tree):
    if mesh is None:
      shard = lambda x: jax.sharding.SingleDeviceSharding(jax.devices()[0])
    else:
      shard = lambda x: jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    shardings = jax.tree.map(shard, tree)
    if mesh is not None and isinstance(tree, nnx.State):
      shardings = sharding.state_shardings(tree, mesh, rules)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        tree, shardings)

  opt = state.opt_state
  opt_target = (opt[0]._replace(mu=abstract(opt[0].mu), nu=abstract(opt[0].nu),
                                count=abstract(opt[0].count)),) + tuple(opt[1:])
  return ck.TrainState(step=0, params=abstract(state.params), opt_state=opt_target,
                       rng=jax.random.key(0), data_position={}, policy_version=0)


def assert_same(restored, state):
  """Asserts that `restored` equals `state`: step, bookkeeping, rng key and every array."""
  assert restored.step == state.step and restored.policy_version == state.policy_version
  assert restored.data_position == state.data_position
  assert jax.dtypes.issubdtype(restored.rng.dtype, jax.dtypes.prng_key)
  np.testing.assert_array_equal(jax.random.key_data(restored.rng),
                                jax.random.key_data(state.rng))
  for tree in ("params", "opt_state"):
    got, want = getattr(restored, tree), getattr(state, tree)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_array_equal(a, b)
