"""Chunked token log-probs and entropy against the references (values and gradients)."""

import functools

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, strategies as st

from tirjax.testing.reference import model_logprobs as ref
from tirjax.models import config, decoder
from tirjax.models.logprobs import logprobs_from_hidden, token_logprobs

pytestmark = pytest.mark.slow  # left out of `make test-fast`

B, L, D, V = 3, 9, 8, 37


@functools.partial(jax.jit, static_argnames=("chunk_size", "temperature", "with_entropy"))
def chunked(h, w, tokens, valid, *, chunk_size, temperature, with_entropy):
  return logprobs_from_hidden(h, w, tokens, valid, chunk_size=chunk_size,
                              temperature=temperature, with_entropy=with_entropy)


@functools.partial(jax.jit, static_argnames=("chunk_size", "temperature", "dense"))
def grads(h, w, tokens, valid, c_logp, c_ent, *, chunk_size, temperature, dense):
  """∂/∂(h, W) of Σ c_logp·logp + Σ c_ent·entropy (arbitrary per-token cotangents)."""
  def loss(h, w):
    if dense:
      logp, ent = ref.dense_logprobs(h, w, tokens, valid, temperature)
    else:
      logp, ent = logprobs_from_hidden(h, w, tokens, valid, chunk_size=chunk_size,
                                       temperature=temperature, with_entropy=True)
    return jnp.sum(logp * c_logp) + jnp.sum(ent * c_ent)
  return jax.grad(loss, argnums=(0, 1))(h, w)


def right_padded(lengths):
  return np.arange(L)[None] < np.asarray(lengths)[:, None]


def batch(seed, valid, scale=1.0):
  rng = np.random.default_rng(seed)
  h = rng.normal(size=(B, L, D)).astype(np.float32) * scale
  w = rng.normal(size=(V, D)).astype(np.float32) * scale
  tokens = rng.integers(0, V, size=(B, L)).astype(np.int32)
  valid = np.asarray(valid, bool)
  return h, w, np.where(valid, tokens, -1), valid  # padding ids may be out of range


# Right-padded rows (the contract) and arbitrary masks (a position counts when it and its
# predecessor are valid).
masks = st.one_of(hnp.arrays(np.int32, (B,), elements=st.integers(0, L)).map(right_padded),
                  hnp.arrays(np.bool_, (B, L)))


@given(seed=st.integers(0, 2**16), valid=masks, chunk=st.sampled_from([1, 5, 8, 24, 100]),
       temperature=st.sampled_from([1.0, 0.6]), scale=st.sampled_from([0.3, 1.0, 3.0]))
def test_values_match_loop_reference(seed, valid, chunk, temperature, scale):
  h, w, tokens, valid = batch(seed, valid, scale)
  logp, ent = chunked(h, w, tokens, valid, chunk_size=chunk, temperature=temperature,
                      with_entropy=True)
  want_logp, want_ent = ref.loop_logprobs(h, w, tokens, valid, temperature)
  tol = 1e-5 * max(1.0, np.abs(want_logp).max())
  np.testing.assert_allclose(logp, want_logp, atol=tol, rtol=0)
  np.testing.assert_allclose(ent, want_ent, atol=tol, rtol=0)
  assert np.all(np.isfinite(logp)) and np.all(logp <= 1e-6)
  assert np.all(logp[:, 0] == 0) and np.all(logp[~valid] == 0) and np.all(ent[~valid] == 0)


@given(seed=st.integers(0, 2**16), valid=masks, chunk=st.sampled_from([1, 5, 24]),
       temperature=st.sampled_from([1.0, 0.6]))
def test_gradients_match_dense_autodiff(seed, valid, chunk, temperature):
  h, w, tokens, valid = batch(seed, valid)
  rng = np.random.default_rng(seed + 1)
  c_logp, c_ent = rng.normal(size=(2, B, L)).astype(np.float32)
  got = grads(h, w, tokens, valid, c_logp, c_ent, chunk_size=chunk, temperature=temperature,
              dense=False)
  want = grads(h, w, tokens, valid, c_logp, c_ent, chunk_size=chunk, temperature=temperature,
               dense=True)
  for g, r in zip(got, want):
    np.testing.assert_allclose(g, r, atol=1e-5 * max(1.0, np.abs(r).max()), rtol=0)


def test_without_entropy_same_logprobs_and_gradient():
  h, w, tokens, valid = batch(0, right_padded([9, 4, 1]))
  logp, ent = chunked(h, w, tokens, valid, chunk_size=5, temperature=1.0, with_entropy=False)
  assert ent is None
  np.testing.assert_allclose(logp, ref.loop_logprobs(h, w, tokens, valid)[0], atol=1e-5)
  c = np.random.default_rng(0).normal(size=(B, L)).astype(np.float32)
  got = jax.grad(lambda h, w: jnp.sum(c * logprobs_from_hidden(
      h, w, tokens, valid, chunk_size=5)[0]), argnums=(0, 1))(h, w)
  want = jax.grad(lambda h, w: jnp.sum(c * ref.dense_logprobs(h, w, tokens, valid)[0]),
                  argnums=(0, 1))(h, w)
  for g, r in zip(got, want):
    np.testing.assert_allclose(g, r, atol=1e-5)


def test_bfloat16_inputs_keep_float32_statistics():
  h, w, tokens, valid = batch(1, right_padded([9, 9, 9]))
  logp, _ = chunked(jnp.asarray(h, jnp.bfloat16), jnp.asarray(w, jnp.bfloat16), tokens, valid,
                    chunk_size=4, temperature=1.0, with_entropy=False)
  assert logp.dtype == jnp.float32
  want, _ = ref.loop_logprobs(np.asarray(jnp.asarray(h, jnp.bfloat16), np.float32),
                              np.asarray(jnp.asarray(w, jnp.bfloat16), np.float32),
                              tokens, valid)
  np.testing.assert_allclose(logp, want, atol=1e-4 * max(1.0, np.abs(want).max()))


def test_single_token_rows():
  h, w, tokens, valid = batch(2, right_padded([1, 1, 0]))
  logp, ent = logprobs_from_hidden(h[:, :1], w, tokens[:, :1], valid[:, :1], chunk_size=4,
                                   with_entropy=True)
  assert logp.shape == ent.shape == (B, 1) and not np.any(logp) and not np.any(ent)


def test_bad_options_are_rejected():
  h, w, tokens, valid = batch(0, right_padded([9, 9, 9]))
  with pytest.raises(ValueError, match="chunk_size"):
    logprobs_from_hidden(h, w, tokens, valid, chunk_size=0)
  with pytest.raises(ValueError, match="temperature"):
    logprobs_from_hidden(h, w, tokens, valid, chunk_size=4, temperature=0.0)


def test_token_logprobs_of_a_model_match_its_logits():
  """On a tiny decoder: values against log_softmax of the model's own logits, and gradients
  with respect to every parameter against autodiff of the dense computation."""
  model = decoder.init(config.tiny(vocab_size=97, tie_word_embeddings=False), seed=1)
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, 97, size=(2, 12)), jnp.int32)
  valid = jnp.arange(12)[None] < jnp.array([[12], [7]])
  c = jnp.asarray(rng.normal(size=(2, 12)), jnp.float32)

  def chunked_loss(model):
    logp, ent = token_logprobs(model, tokens, valid, chunk_size=5, temperature=0.8,
                               with_entropy=True)
    return jnp.sum(c * logp) + jnp.sum(ent), (logp, ent)

  def dense_loss(model):
    logp, ent = ref.dense_logprobs(model.hidden(tokens, valid), model.unembedding, tokens,
                                   valid, 0.8)
    return jnp.sum(c * logp) + jnp.sum(ent), (logp, ent)

  (_, (logp, ent)), g = nnx.jit(nnx.value_and_grad(chunked_loss, has_aux=True))(model)
  (_, (want_logp, want_ent)), want_g = nnx.jit(nnx.value_and_grad(dense_loss, has_aux=True))(model)
  logits = np.asarray(nnx.jit(model)(tokens, valid), np.float64) / 0.8
  lsm = logits - np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1,
                               keepdims=True)) - logits.max(-1, keepdims=True)
  from_logits = np.take_along_axis(lsm[:, :-1], np.asarray(tokens)[:, 1:, None], -1)[..., 0]
  np.testing.assert_allclose(np.asarray(logp)[:, 1:][np.asarray(valid)[:, 1:]],
                             from_logits[np.asarray(valid)[:, 1:]], atol=1e-5)
  np.testing.assert_allclose(logp, want_logp, atol=1e-5)
  np.testing.assert_allclose(ent, want_ent, atol=1e-5)
  for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(want_g)):
    np.testing.assert_allclose(a, b, atol=1e-5 * max(1.0, float(np.abs(b).max())))
