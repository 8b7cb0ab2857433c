"""Choosing the next token from logits, and the per-position statistics a sampler reports.

Pure functions on `[B, V]` float32 logits z, jit- and loop-friendly (no shape depends on a
value; temperature and top-p are traced scalars, so changing them never recompiles).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def nucleus(logits: jax.Array, top_p: jax.Array) -> jax.Array:
  """Top-p filtering (Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration").

  With tokens sorted by probability p_(1) ≥ p_(2) ≥ …, token (i) is kept iff the mass before
  it is below the threshold, Σ_{j<i} p_(j) < top_p: the smallest prefix whose mass reaches
  top_p, never empty. Other logits become −inf (tokens tied with the last kept one are
  kept too). `top_p = 1` keeps every token.
  """
  z = jnp.sort(logits, axis=-1)[..., ::-1]
  p = jax.nn.softmax(z, axis=-1)
  before = jnp.cumsum(p, axis=-1) - p
  kept = jnp.sum(before < top_p, axis=-1, keepdims=True)
  threshold = jnp.take_along_axis(z, jnp.maximum(kept, 1) - 1, axis=-1)
  return jnp.where(logits >= threshold, logits, -jnp.inf)


def inverse_cdf(key: jax.Array, logits: jax.Array) -> jax.Array:
  """Token ids `[B]` drawn from softmax(logits) by inversion: with F the cumulative
  probabilities of a row and u ~ U[0, 1), the first v with F_v > u·F_V. One uniform per row
  (a Gumbel-max draw needs V of them, which dominates a small model's decode step); a token
  of probability 0 is never drawn, since F does not rise at it."""
  cdf = jnp.cumsum(jax.nn.softmax(logits, axis=-1), axis=-1)
  u = jax.random.uniform(key, logits.shape[:-1] + (1,)) * cdf[..., -1:]
  return jnp.minimum(jnp.sum(cdf <= u, axis=-1), logits.shape[-1] - 1)


def choose(key: jax.Array, logits: jax.Array, temperature: jax.Array,
           top_p: jax.Array) -> jax.Array:
  """Token ids `[B]`: a draw from softmax(nucleus(z / temperature, top_p)) per row, or
  argmax z when `temperature == 0` (greedy; top-p then changes nothing)."""
  greedy = jnp.argmax(logits, axis=-1)
  z = logits / jnp.where(temperature > 0, temperature, 1.0)
  z = jax.lax.cond(top_p < 1, nucleus, lambda z, _: z, z, top_p)
  return jnp.where(temperature > 0, inverse_cdf(key, z), greedy)


def raw_stats(logits: jax.Array, tokens: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """What the trainer compares against: log p(token), the entropy H = −Σ_v p_v log p_v, and
  the full log-probs `[B, V]`, all of the raw model (temperature 1, no top-p), whatever
  distribution the token was drawn from."""
  logp = jax.nn.log_softmax(logits, axis=-1)
  chosen = jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
  entropy = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
  return chosen, entropy, logp
