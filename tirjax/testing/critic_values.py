"""Stand-in critic values for tests: one value per token prefix, as a real critic gives.

`prefix_values(r, seed)` writes V(tokens[b, :l]) for every position l: a hash of the prefix
before the token, mapped to [-1, 1). Rows that share a tree node share its prefix, hence its
values, as `Rollouts.values` requires; padding tokens get 0.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from tirjax.rollouts import Rollouts

_MOD = np.uint64(2**61 - 1)


def prefix_value_array(tokens, token_valid, seed: int = 0, scale: float = 1.0) -> np.ndarray:
  """[B, L] f32 values, a hash of (seed, tokens[b, :l]) mapped to [-scale, scale)."""
  tokens = np.asarray(tokens, np.int64)
  B, L = tokens.shape
  h = np.full(B, np.uint64(seed * 7919 + 17), np.uint64)
  out = np.zeros((B, L), np.float32)
  with np.errstate(over="ignore"):
    for l in range(L):
      mixed = (h * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(11)
      out[:, l] = (mixed.astype(np.float64) / 2.0**53 * 2.0 - 1.0) * scale
      h = (h * np.uint64(1_000_003) + np.uint64(tokens[:, l] + 1).astype(np.uint64)) % _MOD
  return np.where(np.asarray(token_valid, bool), out, 0.0).astype(np.float32)


def with_values(r: Rollouts, seed: int = 0, scale: float = 1.0) -> Rollouts:
  """`r` with `values` from `prefix_value_array`."""
  return r.replace(values=jnp.asarray(prefix_value_array(r.tokens, r.token_valid, seed, scale)))
