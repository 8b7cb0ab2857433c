"""Mesh construction, logical-axis shardings of params / optimizer state / batches, and the
loss under jit on a sharded batch (8 simulated CPU devices, see conftest.py)."""

import jax
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from tirjax import advantages, loss, sharding
from tirjax.testing.records import GroupRecord, RowRecord, StepRecord, build_rollouts

MESHES = {  # name: (mesh axes, number of devices used)
    "data8": ((("data", 8), ("fsdp", 1), ("tensor", 1)), 8),
    "data2_fsdp4": ((("data", 2), ("fsdp", 4), ("tensor", 1)), 8),
    "data2_fsdp2_tensor2": ((("data", 2), ("fsdp", 2), ("tensor", 2)), 8),
    "single": ((("data", 1), ("fsdp", 1), ("tensor", 1)), 1),
}


def _mesh(name):
  axes, n = MESHES[name]
  opts = sharding.ShardingOptions(mesh=axes)
  return sharding.make_mesh(opts, devices=None if n == 8 else jax.devices()[3:3 + n])


def test_eight_devices():
  assert jax.device_count() == 8


@pytest.mark.parametrize("name", MESHES)
def test_mesh_shapes(name):
  axes, n = MESHES[name]
  mesh = _mesh(name)
  assert mesh.axis_names == ("data", "fsdp", "tensor")
  assert dict(mesh.shape) == dict(axes)
  assert mesh.devices.size == n
  if n == 1:
    assert mesh.devices.flat[0] == jax.devices()[3]


def test_minus_one_takes_the_rest():
  mesh = sharding.make_mesh(sharding.ShardingOptions(mesh=(("data", -1), ("fsdp", 2),
                                                           ("tensor", 1))))
  assert dict(mesh.shape) == {"data": 4, "fsdp": 2, "tensor": 1}
  assert sharding.mesh_shape((("data", -1), ("fsdp", 1), ("tensor", 1)), 8) == (8, 1, 1)
  assert sharding.mesh_shape((("data", 2), ("fsdp", -1), ("tensor", 2)), 8) == (2, 2, 2)


@pytest.mark.parametrize("axes,n,match", [
    ((("data", 2), ("fsdp", 2), ("tensor", 1)), 8, "multiply to 4, but 8 devices"),
    ((("data", 4), ("fsdp", 4), ("tensor", 1)), 8, "multiply to 16, but 8 devices"),
    ((("data", -1), ("fsdp", 3), ("tensor", 1)), 8, "do not divide"),
])
def test_mesh_size_mismatch_is_clear(axes, n, match):
  with pytest.raises(ValueError, match=match):
    sharding.mesh_shape(axes, n)
  with pytest.raises(ValueError, match="mesh"):
    sharding.make_mesh(sharding.ShardingOptions(mesh=axes))


@pytest.mark.parametrize("kwargs,match", [
    (dict(mesh=(("data", -1), ("fsdp", -1), ("tensor", 1))), "at most one axis"),
    (dict(mesh=(("data", 0), ("fsdp", 1), ("tensor", 1))), "axis 'data' has size 0"),
    (dict(mesh=(("data", 2), ("data", 4))), "distinct"),
    (dict(rules=(("embed", "model"),)), "mesh axis 'model'"),
    (dict(rules=((3, "data"),)), "rules"),
    (dict(rules=(("embed",),)), "each rule is"),
])
def test_options_validation(kwargs, match):
  with pytest.raises(ValueError, match=match):
    sharding.ShardingOptions(**kwargs)


def test_options_accept_config_lists_and_stay_hashable():
  opts = sharding.ShardingOptions(mesh=[["data", -1], ["fsdp", 1], ["tensor", 1]],
                                  rules=[["batch", ["data", "fsdp"]], ["embed", "fsdp"]])
  assert opts.rules == (("batch", ("data", "fsdp")), ("embed", "fsdp"))
  hash(opts)


def test_logical_to_spec_rules():
  assert sharding.logical_to_spec(("embed", "mlp")) == P("fsdp", "tensor")
  assert sharding.logical_to_spec(("batch", None, "vocab")) == P(("data", "fsdp"), None, "tensor")
  assert sharding.logical_to_spec(("layers", "embed")) == P(None, "fsdp")
  # A mesh axis shards one dimension only; a later rule for the same name is the fallback.
  assert sharding.logical_to_spec(("embed", "embed")) == P("fsdp", None)
  rules = (("embed", "fsdp"), ("embed", "tensor"))
  assert sharding.logical_to_spec(("embed", "embed"), rules) == P("fsdp", "tensor")
  assert sharding.logical_to_spec(("heads", "kv_heads")) == P("tensor", None)


PARAMS = {
    "embedding": np.ones((16, 8), np.float32),
    "attn": {"q": np.ones((8, 4, 2), np.float32), "kv": np.ones((8, 2, 2), np.float32)},
    "mlp": {"up": np.ones((8, 16), np.float32), "down": np.ones((16, 8), np.float32)},
    "norm": np.ones((8,), np.float32),
    "step": np.zeros((), np.int32),
}
AXES = {
    "embedding": ("vocab", "embed"),
    "attn": {"q": ("embed", "heads", "head_dim"), "kv": ("embed", "kv_heads", "head_dim")},
    "mlp": {"up": ("embed", "mlp"), "down": ("mlp", "embed")},
    "norm": ("norm",),
    "step": (),
}


def _want_specs():
  t = "tensor"
  return {
      "embedding": P(t, "fsdp"), "attn": {"q": P("fsdp", t, None), "kv": P("fsdp", t, None)},
      "mlp": {"up": P("fsdp", t), "down": P(t, "fsdp")}, "norm": P(None), "step": P(),
  }


@pytest.mark.parametrize("name", MESHES)
def test_shard_params_by_logical_axes(name):
  mesh = _mesh(name)
  sharded = sharding.shard_params(PARAMS, AXES, mesh)
  specs = jax.tree.map(lambda x: x.sharding.spec, sharded)
  assert specs == _want_specs()
  for x, host in zip(jax.tree.leaves(sharded), jax.tree.leaves(PARAMS)):
    assert x.sharding.mesh == mesh
    spec = tuple(x.sharding.spec) + (None,) * (host.ndim - len(x.sharding.spec))
    want_shard = tuple(d // (1 if ax is None else mesh.shape[ax])
                       for d, ax in zip(host.shape, spec))
    assert {s.data.shape for s in x.addressable_shards} == {want_shard}
    np.testing.assert_array_equal(np.asarray(x), host)


def test_shard_params_indivisible_dimension_is_named():
  mesh = sharding.make_mesh(sharding.ShardingOptions(mesh=(("data", 1), ("fsdp", 2),
                                                           ("tensor", 4))))
  with pytest.raises(ValueError, match=r"\['attn'\]\['kv'\]: dimension 1 .* size 2"):
    sharding.shard_params(PARAMS, AXES, mesh)


def test_shard_nnx_state_from_partition_metadata():
  mesh = _mesh("data2_fsdp2_tensor2")
  with nnx.use_eager_sharding(False):
    model = nnx.Linear(8, 4, rngs=nnx.Rngs(0), kernel_init=nnx.with_partitioning(
        nnx.initializers.lecun_normal(), ("embed", "mlp")))
  state = nnx.state(model, nnx.Param)
  sharded = sharding.shard_params(state, nnx.get_partition_spec(state), mesh)
  assert sharded["kernel"].value.sharding.spec == P("fsdp", "tensor")
  assert sharded["bias"].value.sharding.spec == P()
  nnx.update(model, sharded)
  assert model.kernel.value.sharding.spec == P("fsdp", "tensor")


def test_optimizer_state_mirrors_params():
  mesh = _mesh("data2_fsdp2_tensor2")
  params = sharding.shard_params(PARAMS, AXES, mesh)
  floats = {k: v for k, v in params.items() if k != "step"}
  shard = sharding.param_shardings({k: v for k, v in AXES.items() if k != "step"}, mesh)
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
  abstract = jax.eval_shape(tx.init, floats)
  shardings = sharding.opt_state_shardings(tx, abstract, shard)
  state = jax.jit(tx.init, out_shardings=shardings)(floats)
  adam = state[1][0]
  want = jax.tree.map(lambda s: s.spec, shard)
  assert jax.tree.map(lambda x: x.sharding.spec, adam.mu) == want
  assert jax.tree.map(lambda x: x.sharding.spec, adam.nu) == want
  assert adam.count.sharding.spec == P()


def _rollouts(num_rows):
  groups = []
  for g in range(num_rows // 2):
    groups.append(GroupRecord(rows=[
        RowRecord(outcome=1, steps=[StepRecord(tokens=(3, 4, 5), logprobs=(-0.4, -1.1, -0.3),
                                               calls=[{"name": "f", "arguments": {"x": g}}])]),
        RowRecord(outcome=-1, steps=[StepRecord(tokens=(6, 7), logprobs=(-2.0, -0.6)),
                                     StepRecord(tokens=(8,), logprobs=(-0.9,))]),
    ], gt_calls=[{"name": "f", "arguments": {"x": g}}]))
  return build_rollouts(groups, max_tokens=8, with_ref=True)


@pytest.mark.parametrize("name", MESHES)
def test_shard_rollouts_batch(name):
  mesh = _mesh(name)
  r = _rollouts(8)
  sharded = sharding.shard_batch(r, mesh)
  shards = mesh.shape["data"] * mesh.shape["fsdp"]
  for x, host in zip(jax.tree.leaves(sharded), jax.tree.leaves(r)):
    assert x.sharding.spec == P(("data", "fsdp"))
    assert x.shape == host.shape
    assert {s.data.shape for s in x.addressable_shards} == {(8 // shards,) + host.shape[1:]}
    np.testing.assert_array_equal(np.asarray(x), np.asarray(host))
  assert sharded.calls.pred_keys.sharding.spec == P(("data", "fsdp"))


def test_shard_batch_rows_must_divide():
  mesh = _mesh("data2_fsdp4")
  with pytest.raises(ValueError, match="6 rows do not divide over the 8 batch shards"):
    sharding.shard_batch(_rollouts(6), mesh)
  with pytest.raises(ValueError, match="has 4 rows"):
    sharding.shard_batch({"a": np.zeros(8), "b": np.zeros(4)}, mesh)


_loss = jax.jit(loss.rollouts_loss, static_argnames="opts")


@pytest.mark.parametrize("name", MESHES)
def test_loss_on_sharded_batch_equals_unsharded(name):
  r = _rollouts(8)
  adv = advantages.get("grpo")(r)
  rng = np.random.default_rng(0)
  logp = np.asarray(r.old_logprobs + rng.normal(0, 0.3, r.old_logprobs.shape), np.float32)
  ent = rng.uniform(0, 2, logp.shape).astype(np.float32)
  opts = loss.LossOptions(clip_high=0.28, dual_clip=3.0, kl_coef=0.01, entropy_coef=0.001)
  want = loss.finalize(_loss(logp, r, adv, opts=opts, entropy=ent))
  mesh = _mesh(name)
  s_logp, s_r, s_adv, s_ent = sharding.shard_batch((logp, r, adv, ent), mesh)
  out = _loss(s_logp, s_r, s_adv, opts=opts, entropy=s_ent)
  assert out.loss.sum.sharding.is_fully_replicated
  assert len(out.loss.sum.sharding.device_set) == mesh.devices.size
  got = loss.finalize(out)
  assert got.keys() == want.keys()
  for k in want:
    np.testing.assert_allclose(float(got[k]), float(want[k]), rtol=1e-6, atol=1e-6, err_msg=k)
