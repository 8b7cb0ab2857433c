"""The decoder on its own: padding semantics, jit, sharding on a mesh, remat, bfloat16.
(Numerical parity with the reference implementations is in test_models_hf.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tirjax import sharding
from tirjax.models import config, decoder

L = 16


@pytest.fixture(scope="module")
def model():
  m = decoder.init(config.tiny(vocab_size=300, family="qwen2", tie_word_embeddings=False), 3)
  # Non-zero biases and non-unit norms, so that every parameter matters.
  state = nnx.state(m)
  keys = iter(jax.random.split(jax.random.key(1), len(jax.tree.leaves(state))))
  nnx.update(m, jax.tree.map(lambda x: x + 0.1 * jax.random.normal(next(keys), x.shape), state))
  return m


forward = nnx.jit(lambda m, t, v: m(t, v))


def test_padding_never_changes_valid_logits(model):
  """Right padding (any pad ids), left padding and no padding agree on the real tokens;
  positions are the running count of valid tokens."""
  rng = np.random.default_rng(0)
  row = rng.integers(0, 300, size=10)
  right = np.zeros((3, L), np.int32)
  right[0, :10] = row
  right[1, :10] = row
  right[1, 10:] = rng.integers(-1, 300, size=L - 10)  # other padding ids, -1 included
  right[1, -1] = -1
  right[2, L - 10:] = row  # left padded
  valid = np.zeros((3, L), bool)
  valid[:2, :10] = True
  valid[2, L - 10:] = True
  out = np.asarray(forward(model, jnp.asarray(right), jnp.asarray(valid)))
  alone = np.asarray(forward(model, jnp.asarray(row[None]), None))[0]
  np.testing.assert_allclose(out[0, :10], alone, atol=1e-5)
  np.testing.assert_allclose(out[1, :10], alone, atol=1e-5)
  np.testing.assert_allclose(out[2, L - 10:], alone, atol=1e-5)
  assert np.all(np.isfinite(out))


def test_causal(model):
  rng = np.random.default_rng(1)
  a = rng.integers(0, 300, size=(1, L))
  b = a.copy()
  b[0, 9:] = rng.integers(0, 300, size=L - 9)
  out = forward(model, jnp.asarray(np.concatenate([a, b])), None)
  np.testing.assert_allclose(out[0, :9], out[1, :9], atol=1e-5)
  assert np.abs(out[0, 9:] - out[1, 9:]).max() > 1e-3


def test_all_padding_row_is_finite(model):
  out = forward(model, jnp.zeros((2, L), jnp.int32), jnp.zeros((2, L), bool))
  assert out.dtype == jnp.float32 and out.shape == (2, L, 300)
  assert np.all(np.isfinite(out))


def test_sharded_forward_equals_single_device(model):
  tokens = jnp.asarray(np.random.default_rng(2).integers(0, 300, size=(4, L)), jnp.int32)
  valid = jnp.arange(L)[None] < jnp.array([[L], [5], [11], [1]])
  want = np.asarray(forward(model, tokens, valid))
  mesh = sharding.make_mesh(sharding.ShardingOptions(mesh=(("data", 2), ("fsdp", 2),
                                                           ("tensor", 2))))
  sharded = nnx.merge(*nnx.split(model))
  sharding.shard_model(sharded, mesh)
  assert sharded.lm_head[...].sharding.spec == jax.sharding.PartitionSpec("tensor", "fsdp")
  assert sharded.layers.mlp.down_proj[...].sharding.spec == jax.sharding.PartitionSpec(
      None, "tensor", "fsdp")
  with jax.set_mesh(mesh):
    got = forward(sharded, tokens, valid)
  assert got.sharding.spec[0] == ("data", "fsdp")  # batch constrained onto the data axes
  np.testing.assert_allclose(got, want, atol=1e-5)


def test_activations_follow_the_rules_given_at_construction(model):
  """The rules passed to the Decoder (the config's ShardingOptions.rules) decide the
  activation shardings; the parameters are the same."""
  rules = (("batch", "data"), ("embed", "fsdp"), ("vocab", "tensor"))
  custom = nnx.merge(nnx.graphdef(decoder.abstract(model.config, rules=rules)),
                     nnx.state(model))
  tokens = jnp.asarray(np.random.default_rng(5).integers(0, 300, size=(4, L)), jnp.int32)
  mesh = sharding.make_mesh(sharding.ShardingOptions(mesh=(("data", 2), ("fsdp", 2),
                                                           ("tensor", 2)), rules=rules))
  sharding.shard_model(custom, mesh)
  with jax.set_mesh(mesh):
    got = forward(custom, tokens, None)
  assert got.sharding.spec[0] == "data"
  np.testing.assert_allclose(got, forward(model, tokens, None), atol=1e-5)


def test_explicit_mesh_is_rejected(model):
  mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
  with jax.set_mesh(mesh), pytest.raises(ValueError, match="Auto"):
    forward(model, jnp.zeros((8, L), jnp.int32), None)


def test_remat_gives_the_same_gradients(model):
  tokens = jnp.asarray(np.random.default_rng(3).integers(0, 300, size=(2, L)), jnp.int32)

  def grads(m):
    return nnx.jit(nnx.grad(lambda m: jnp.mean(jax.nn.log_softmax(m(tokens))[..., 0])))(m)

  remat = nnx.merge(nnx.graphdef(decoder.abstract(model.config.replace(remat=True))),
                    nnx.state(model))
  for a, b in zip(jax.tree.leaves(grads(model)), jax.tree.leaves(grads(remat))):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_bfloat16_model():
  cfg = config.tiny(vocab_size=300)
  f32 = decoder.init(cfg)
  bf16 = nnx.merge(nnx.graphdef(decoder.abstract(cfg.replace(param_dtype="bfloat16",
                                                             dtype="bfloat16"))),
                   jax.tree.map(lambda x: x.astype(jnp.bfloat16), nnx.state(f32)))
  tokens = jnp.asarray(np.random.default_rng(4).integers(0, 300, size=(2, L)), jnp.int32)
  assert bf16.hidden(tokens).dtype == jnp.bfloat16
  got, want = forward(bf16, tokens, None), forward(f32, tokens, None)
  assert got.dtype == jnp.float32
  assert np.abs(got - want).max() < 0.05 * np.abs(want).max()
