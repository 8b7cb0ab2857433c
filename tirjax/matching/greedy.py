"""Greedy one-to-one matching, as the public MatchTIR code does under the name "KM".

MatchTIR's `hungarian_assignment` (CyberSculptor96/MatchTIR,
`Code/verl/utils/reward_score/tool.py`) is not the Hungarian algorithm: it lists every
(score, predicted i, ground-truth j) pair in row-major order, sorts them by score with
Python's stable descending sort, and takes each pair whose two ends are still free and whose
score is > 0. That equals repeatedly taking the globally largest remaining positive pair,
ties going to the smallest row-major index (i, j) — which is what this kernel does, with one
masked arg-max over the [m, n] matrix per step (row maxima first, then the row holding the
largest): no sort, no Python loop per row.
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
  # Two levels: the best open pair of each row (a reduction over the n columns), then the first
  # row holding the overall best and the first column of that row holding it: the first
  # row-major pair attaining the maximum, as one arg-max over all m·n pairs would give, but each
  # step passes over the [n, m] weights once (closing a row and a column, fused with the
  # rows' new maxima) instead of three times. Laid out [N, n, m], the row maxima reduce over a
  # non-minor axis, elementwise over contiguous rows.
  x = jnp.swapaxes(masked_weights(weights, row_valid, col_valid), 1, 2)  # [N, n, m]
  N, n, m = x.shape
  row_ids = jnp.arange(m, dtype=jnp.int32)[None, :]
  col_ids = jnp.arange(n, dtype=jnp.int32)[None, :]

  def step(_, state):
    x, row_best, r2c, c2r = state  # closed pairs hold 0 in x
    best = jnp.max(row_best, axis=1)
    i = jnp.min(jnp.where(row_best == best[:, None], row_ids, m), axis=1)
    # row i's weights (i < m: best is attained somewhere, if only by a 0)
    in_row = jnp.take_along_axis(x, jnp.minimum(i, m - 1)[:, None, None], axis=2)[:, :, 0]
    j = jnp.min(jnp.where(in_row == best[:, None], col_ids, n), axis=1)
    take = best > 0
    row_taken = take[:, None] & (row_ids == i[:, None])
    col_taken = take[:, None] & (col_ids == j[:, None])
    r2c = jnp.where(row_taken, j[:, None], r2c)
    c2r = jnp.where(col_taken, i[:, None], c2r)
    x = jnp.where(row_taken[:, None, :] | col_taken[:, :, None], 0.0, x)
    return x, jnp.max(x, axis=1), r2c, c2r

  state = (x, jnp.max(x, axis=1), jnp.full((N, m), -1, jnp.int32), jnp.full((N, n), -1, jnp.int32))
  _, _, r2c, c2r = jax.lax.fori_loop(0, min(m, n), step, state)
  return r2c, c2r
