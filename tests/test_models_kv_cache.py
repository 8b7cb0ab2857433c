"""KV-cache decoding: prefill + decode steps give the full forward's logits, per family, on
ragged batches (float32, 1e-5)."""

import hypothesis
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import strategies as st

from tirjax.models import config, decoder, kv_cache

# One worker builds the module's model and compiled buckets (make test: --dist loadgroup).
pytestmark = pytest.mark.xdist_group("kv_cache")

V, B, P, STEPS = 97, 4, 8, 6
S = P + STEPS

FAMILIES = {
    "qwen3": config.tiny(vocab_size=V),
    "qwen2": config.tiny(vocab_size=V, family="qwen2", tie_word_embeddings=False),
    "llama": config.tiny(vocab_size=V, family="llama", rope_scaling=config.RopeScaling(
        factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=16)),
}


def _perturbed(cfg):
  """Random weights with non-zero biases and non-unit norms, so every parameter matters."""
  m = decoder.init(cfg, 3)
  state = nnx.state(m)
  keys = iter(jax.random.split(jax.random.key(1), len(jax.tree.leaves(state))))
  nnx.update(m, jax.tree.map(lambda x: x + 0.1 * jax.random.normal(next(keys), x.shape), state))
  return m


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def model(request):
  return _perturbed(FAMILIES[request.param])


@nnx.jit
def cached_logits(model, prompts, lengths, new):
  """Logits `[STEPS + 1, B, V]`: after the prompt, then after each token of `new [B, STEPS]`."""
  first, cache = kv_cache.prefill(model, prompts, lengths, S)

  def step(cache, tok):
    logits, cache = kv_cache.decode_step(model, cache, tok)
    return cache, logits

  cache, rest = jax.lax.scan(step, cache, new.T)
  return jnp.concatenate([first[None], rest]), cache.lengths


@nnx.jit
def full_logits(model, tokens, valid):
  return model(tokens, valid)


def _check(model, prompts, lengths, new):
  """Row b = prompt[:len_b] ++ new[b], right-padded to S with junk ids."""
  got, got_lengths = cached_logits(model, jnp.asarray(prompts), jnp.asarray(lengths),
                                   jnp.asarray(new))
  rows = np.full((B, S), V - 1, np.int32)
  for b in range(B):
    rows[b, :lengths[b]] = prompts[b, :lengths[b]]
    rows[b, lengths[b]:lengths[b] + STEPS] = new[b]
  valid = np.arange(S)[None] < (lengths + STEPS)[:, None]
  want = np.asarray(full_logits(model, jnp.asarray(rows), jnp.asarray(valid)))
  got = np.asarray(got)
  for b in range(B):
    for j in range(STEPS + 1):
      np.testing.assert_allclose(got[j, b], want[b, lengths[b] - 1 + j], atol=1e-5, rtol=0,
                                 err_msg=f"row {b} (prompt {lengths[b]}), step {j}")
  np.testing.assert_array_equal(got_lengths, lengths + STEPS)


@hypothesis.settings(max_examples=8)
@hypothesis.given(st.data())
def test_prefill_then_decode_equals_full_forward(model, data):
  lengths = np.array(data.draw(st.lists(st.integers(1, P), min_size=B, max_size=B)), np.int32)
  seed = data.draw(st.integers(0, 2**31 - 1))
  rng = np.random.default_rng(seed)
  # Prompt padding holds arbitrary ids, which must not leak into any row.
  prompts = rng.integers(0, V, size=(B, P)).astype(np.int32)
  new = rng.integers(0, V, size=(B, STEPS)).astype(np.int32)
  _check(model, prompts, lengths, new)


def test_full_length_prompts_and_cache_layout(model):
  cfg = model.config
  prompts = np.random.default_rng(0).integers(0, V, size=(B, P)).astype(np.int32)
  lengths = np.full(B, P, np.int32)
  _check(model, prompts, lengths, np.zeros((B, STEPS), np.int32))
  _, cache = nnx.jit(lambda m, t, n: kv_cache.prefill(m, t, n, S))(
      model, jnp.asarray(prompts), jnp.asarray(lengths))
  shape = (cfg.num_layers, B, S, cfg.num_kv_heads, cfg.head_dim)
  assert cache.k.shape == cache.v.shape == shape and cache.size == S
  assert cache.k.dtype == jnp.float32


def test_cache_smaller_than_prompt_is_rejected(model):
  with pytest.raises(ValueError, match="size"):
    kv_cache.prefill(model, jnp.zeros((1, P), jnp.int32), jnp.ones((1,), jnp.int32), P - 1)
