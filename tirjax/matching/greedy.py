"""Greedy one-to-one matching, as the public MatchTIR code does under the name "KM".

MatchTIR's `hungarian_assignment` (CyberSculptor96/MatchTIR,
`Code/verl/utils/reward_score/tool.py`) is not the Hungarian algorithm: it lists every
(score, predicted i, ground-truth j) pair in row-major order, sorts them by score with
Python's stable descending sort, and takes each pair whose two ends are still free and whose
score is > 0. That equals repeatedly taking the globally largest remaining positive pair,
ties going to the smallest row-major index (i, j) — which is what this kernel does, with one
masked arg-max over the flattened [m, n] matrix per step: no sort, no Python loop per row.
It can fall short of the exact maximum (`hungarian.py`); spec §4.3 offers both.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from tirjax.matching.chunks import map_chunks
from tirjax.matching.hungarian import Matching, masked_weights


def greedy_matching(weights: jax.Array, row_valid: Optional[jax.Array] = None,
                    col_valid: Optional[jax.Array] = None) -> Matching:
  """MatchTIR's greedy matching of each [m, n] matrix of a batch [N, m, n].

  Args:
    weights: [N, m, n] pair weights (similarities).
    row_valid: optional [N, m] bool, False on padding rows.
    col_valid: optional [N, n] bool, False on padding columns.

  Returns:
    A `Matching`; only pairs of positive weight are taken.
  """
  N, m, n = weights.shape
  if m == 0 or n == 0:
    return Matching(row_to_col=jnp.full((N, m), -1, jnp.int32),
                    col_to_row=jnp.full((N, n), -1, jnp.int32))
  r2c, c2r = map_chunks(_greedy, (weights, row_valid, col_valid))
  return Matching(row_to_col=r2c, col_to_row=c2r)


def _greedy(weights, row_valid, col_valid):
  w = masked_weights(weights, row_valid, col_valid)
  N, m, n = w.shape
  flat = w.reshape(N, m * n)
  pos = jnp.arange(m * n, dtype=jnp.int32)[None, :]
  pair_row, pair_col = pos // n, pos % n
  row_ids = jnp.arange(m, dtype=jnp.int32)[None, :]
  col_ids = jnp.arange(n, dtype=jnp.int32)[None, :]

  def step(_, state):
    open_pairs, r2c, c2r = state
    x = jnp.where(open_pairs, flat, 0.0)
    best = jnp.max(x, axis=1)
    # The first (row-major) pair attaining the maximum: Python's stable sort order.
    k = jnp.min(jnp.where(open_pairs & (x == best[:, None]), pos, m * n), axis=1)
    take = best > 0
    i, j = k // n, k % n
    r2c = jnp.where(take[:, None] & (row_ids == i[:, None]), j[:, None], r2c)
    c2r = jnp.where(take[:, None] & (col_ids == j[:, None]), i[:, None], c2r)
    closed = take[:, None] & ((pair_row == i[:, None]) | (pair_col == j[:, None]))
    return open_pairs & ~closed, r2c, c2r

  state = (flat > 0, jnp.full((N, m), -1, jnp.int32), jnp.full((N, n), -1, jnp.int32))
  _, r2c, c2r = jax.lax.fori_loop(0, min(m, n), step, state)
  return r2c, c2r
