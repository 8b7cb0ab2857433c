"""Exact maximum-weight one-to-one matching, batched (Kuhn-Munkres / Jonker-Volgenant).

For each of N padded similarity matrices W [m, n] (m predicted calls, n ground-truth calls),
finds a matching π maximising Σ_{(u,v) ∈ π} W[u, v] (HiDiffTIR Eq. 2; spec §4.2). Pairs with
weight ≤ 0 count as unmatched, and padding pairs have weight 0, so the maximum-weight matching
is the positive part of a minimum-cost *assignment* (cost −W) of the smaller side into the
larger one: any matching extends to such an assignment with zero-weight pairs.

The assignment is solved by shortest augmenting paths with dual potentials (Kuhn 1955;
Jonker & Volgenant 1987), in the rectangular form of Crouse 2016, "On implementing 2D
rectangular assignment algorithms" (the algorithm behind `scipy.optimize.linear_sum_assignment`):
one augmentation per row of the smaller side, each a Dijkstra search over at most (rows
assigned so far + 1) steps; see `_assign` for the row-based search used here. The whole
batch advances in lockstep through `lax` loops (no Python loop per problem), chunk by chunk
(`chunks.map_chunks`).

Among several optimal matchings the one returned is spec §4.2's: each ground-truth call, in
order, gets the earliest predicted call it can have in an optimal matching (`ties.py`, from the
assignment's optimal duals). So the ground-truth calls are always the assigned side (a batch
with fewer predicted calls is padded with empty ones).

Why not `optax.assignment.hungarian_algorithm` (issue 17, measured by
`benchmarks.bench_kernels` at the papers' batch, 4096 matrices of 40 × 8, on the 2-core CPU):
vmapped, it takes 49 ms against this matcher's 30 ms, so speed would allow it, but it returns
only the assignment. The tie rule needs the assignment's optimal duals (`ties.py` reads the
reduced costs), and optax's own choice among tied optimal matchings differs from spec §4.2's on
1.4 % of the batch's rows; recovering duals from its assignment would be a second shortest-path
solve, more code than it saves. The benchmark keeps timing it (`assignment_hungarian_optax`).
"""

from __future__ import annotations

from typing import Optional

import chex
import flax.struct
import jax
import jax.numpy as jnp

from tirjax.matching.chunks import map_chunks
from tirjax.matching.ties import lexicographic_fix


@flax.struct.dataclass(frozen=True)
class Matching:
  """A batch of one-to-one matchings; -1 marks an unmatched entry."""

  row_to_col: jax.Array  # [N, m] int32
  col_to_row: jax.Array  # [N, n] int32


def masked_weights(weights, row_valid=None, col_valid=None) -> jax.Array:
  """Weights [N, m, n] with padding pairs, non-positive and non-finite weights set to 0 (a NaN
  would make every comparison of the search false, and its loops never end)."""
  chex.assert_rank(weights, 3)
  w = jnp.asarray(weights, jnp.float32)
  w = jnp.where(jnp.isfinite(w), jnp.maximum(w, 0.0), 0.0)
  if row_valid is not None:
    w = jnp.where(row_valid[:, :, None], w, 0.0)
  if col_valid is not None:
    w = jnp.where(col_valid[:, None, :], w, 0.0)
  return w


def max_weight_matching(weights: jax.Array, row_valid: Optional[jax.Array] = None,
                        col_valid: Optional[jax.Array] = None) -> Matching:
  """Exact maximum-weight matching of each [m, n] matrix of a batch [N, m, n].

  Args:
    weights: [N, m, n] pair weights (similarities).
    row_valid: optional [N, m] bool, False on padding rows.
    col_valid: optional [N, n] bool, False on padding columns.

  Returns:
    A `Matching`; a row or column is matched only through a pair of positive weight.
  """
  N, m, n = weights.shape
  if m == 0 or n == 0:
    return Matching(row_to_col=jnp.full((N, m), -1, jnp.int32),
                    col_to_row=jnp.full((N, n), -1, jnp.int32))
  # The ground-truth calls (columns) are assigned into the predicted calls at cost −w (each
  # gets a predicted call; pairs of weight ≤ 0 are dropped afterwards). With fewer predicted
  # calls than ground-truth ones, empty predicted calls make up the difference.
  if m < n:
    weights = jnp.pad(jnp.asarray(weights), ((0, 0), (0, n - m), (0, 0)))
    row_valid = None if row_valid is None else jnp.pad(row_valid, ((0, 0), (0, n - m)))
  m_solved = max(m, n)

  def solve(w, rv, cv):
    cost = _batch_minor(lambda w, rv, cv: -masked_weights(w, rv, cv), (w, rv, cv), 2)
    col4row, u, vr = _assign(cost)  # [n, chunk] each; cost [n, m, chunk]
    cost_bm = jnp.transpose(cost, (2, 0, 1))  # [chunk, n, m]
    v_col = jnp.zeros((cost_bm.shape[0], m_solved), jnp.float32).at[
        jnp.arange(cost_bm.shape[0])[:, None], col4row.T].set(vr.T)
    col4row = lexicographic_fix(cost_bm, col4row.T, u.T, v_col)  # [chunk, n]
    gain = -jnp.take_along_axis(cost_bm, col4row[:, :, None], axis=2)[:, :, 0]
    return jnp.where(gain > 0, col4row, -1)

  col4row = map_chunks(solve, (weights, row_valid, col_valid))  # [N, n]: GT → predicted
  row4col = _invert(col4row, m_solved)[:, :m]
  return Matching(row_to_col=row4col, col_to_row=col4row)


def _invert(col4row, num_cols: int) -> jax.Array:
  """[N, r] column of each row (-1: none) → [N, num_cols] row of each column (-1: none)."""
  hit = col4row[:, :, None] == jnp.arange(num_cols)[None, None, :]  # [N, r, c]
  rows = jnp.arange(col4row.shape[1], dtype=jnp.int32)[None, :, None]
  return jnp.where(jnp.any(hit, axis=1), jnp.sum(jnp.where(hit, rows, 0), axis=1),
                   -1).astype(jnp.int32)


def _batch_minor(fn, xs, axis: int, pieces: int = 4) -> jax.Array:
  """fn(*xs) [N, a, b] laid out as [size of `axis`, size of the other axis, N].

  `fn` acts elementwise along the batch: it is applied to one slice of the batch at a time
  (each x in `xs` is an array with a leading batch axis, or None), and each result is
  transposed into place. A plain transpose would be fused into, and so recomputed by, each
  of its ~30 consumers (5 MB each at paper scale), while a loop's result is materialised
  once. The last slice may overlap the one before (dynamic slices clamp): equal values.
  """
  N, a, b = xs[0].shape
  size = -(-N // pieces)
  shape = (a, b)[axis - 1], (a, b)[2 - axis]

  def put(k, out):
    part = fn(*(None if x is None else jax.lax.dynamic_slice_in_dim(x, k * size, size, 0)
                for x in xs))
    return jax.lax.dynamic_update_slice_in_dim(out, jnp.transpose(part, (axis, 3 - axis, 0)),
                                               k * size, 2)

  return jax.lax.fori_loop(0, -(-N // size), put, jnp.zeros(shape + (N,), jnp.float32))


def _pick(x, idx):
  """x[idx[b], ..., b] for x [k, ..., N] and idx [N], by a select chain over k (k is small)."""
  out = x[0]
  for k in range(1, x.shape[0]):
    out = jnp.where(idx == k, x[k], out)
  return out


def _assign(cost: jax.Array) -> jax.Array:
  """Minimum-cost assignment of every row of cost [nr, nc, N] (nr ≤ nc) to a column.

  Crouse's shortest augmenting path, with the Dijkstra search run over *rows*: a column is
  either assigned (then reaching it means reaching its row) or free, and a free column has
  never been settled, so its dual potential is still 0. Reaching the free columns from row r
  therefore costs T[r] − u[r] with T[r] = min over free columns of cost[r, j], and the search
  needs only per-row state plus a[s, r] = cost[s, col4row[r]] — no per-step pass over the nc
  columns (one pass per augmentation computes T). Column potentials are kept per assigned
  row (vr[r] = v[col4row[r]]). Costs may be negative: starting from zero potentials, only
  the edges out of the row being augmented can have negative reduced costs, and those are
  the first edges of every path. Rows are augmented in order, so augmentation `cur`
  (unrolled: nr is small and static) touches only rows 0..cur. The batch is the minor axis
  (several times faster on CPU than batch-major for these short rows); problems whose search
  has ended are masked, not branched on.

  Returns:
    (col4row, u, vr), each [nr, N]: the column of each row, the row potentials, and the
    potential of each row's column (columns left free keep potential 0); reduced costs
    `cost − u − v` are ≥ 0, and 0 on the assignment (the optimal duals).
  """
  nr, nc, N = cost.shape
  cols = jnp.arange(nc, dtype=jnp.int32)[:, None]
  inf = jnp.float32(jnp.inf)
  u = jnp.zeros((0, N), jnp.float32)  # row potentials of the rows augmented so far
  vr = jnp.zeros((0, N), jnp.float32)  # potentials of their columns
  col4row = jnp.zeros((0, N), jnp.int32)
  a = jnp.zeros((0, 0, N), jnp.float32)  # a[s, r] = cost[s, col4row[r]]
  taken = jnp.zeros((nc, N), jnp.float32)  # +inf on assigned columns

  for cur in range(nr):
    n = cur + 1
    rows = jnp.arange(n, dtype=jnp.int32)[:, None]
    c = cost[:n]
    u = jnp.concatenate([u, jnp.zeros((1, N), jnp.float32)])
    vr = jnp.concatenate([vr, jnp.zeros((1, N), jnp.float32)])
    col4row = jnp.concatenate([col4row, jnp.full((1, N), -1, jnp.int32)])
    new_row = jnp.take_along_axis(c[cur], jnp.clip(col4row[:cur], 0, nc - 1), axis=0)
    a = jnp.concatenate([jnp.concatenate([a, jnp.zeros((cur, 1, N), jnp.float32)], axis=1),
                         jnp.concatenate([new_row, jnp.zeros((1, N))])[None]], axis=0)
    open_rows = col4row >= 0  # assigned rows: reachable through their columns
    t_free = jnp.min(c + taken[None], axis=1)  # [n, N] cheapest free column of each row
    to_free = t_free - u  # reduced cost from each row to its cheapest free column
    av = a - vr[None]  # [s, r, N]: reduced cost from row s to row r's column, plus u[s]

    def search_body(s, rows=rows, open_rows=open_rows, u=u, av=av, to_free=to_free, n=n):
      i, min_val, dist, pred, settled, best, best_row, done = s
      active = ~done
      settled = settled | ((rows == i) & active)
      # Tentative distances of the assigned rows, reached through their columns from row i.
      reach = (min_val - _pick(u, i)) + _pick(av, i)
      better = active & open_rows & ~settled & (reach < dist)
      dist = jnp.where(better, reach, dist)
      pred = jnp.where(better, i, pred)
      free_dist = min_val + _pick(to_free, i)
      closer = active & (free_dist < best)
      best = jnp.where(closer, free_dist, best)
      best_row = jnp.where(closer, i, best_row)
      key = jnp.where(open_rows & ~settled, dist, inf)
      lowest = jnp.min(key, axis=0)
      # First index by a min-reduction (argmin is a slow variadic reduce on CPU); on a tie,
      # a free column wins (it ends the search).
      nearest = jnp.min(jnp.where(key == lowest, rows, n), axis=0)
      ends = active & (best <= lowest)
      i = jnp.where(active & ~ends, nearest, i)
      min_val = jnp.where(active, jnp.where(ends, best, lowest), min_val)
      return i, min_val, dist, pred, settled, best, best_row, done | ends

    init = (jnp.full((N,), cur, jnp.int32), jnp.zeros((N,), jnp.float32),
            jnp.full((n, N), inf), jnp.full((n, N), -1, jnp.int32), jnp.zeros((n, N), bool),
            jnp.full((N,), inf), jnp.full((N,), -1, jnp.int32), jnp.zeros((N,), bool))
    # Each pass settles a row or ends the search: at most n + 1 passes (a bound, should a
    # comparison never hold).
    _, min_val, dist, pred, settled, _, best_row, _ = _bounded_while(
        lambda s: jnp.any(~s[-1]), search_body, init, n + 1)
    # The free column reached: the first cheapest free column of `best_row`.
    row_cost = _pick(c, best_row) + taken  # [nc, N]
    sink = jnp.min(jnp.where(row_cost == _pick(t_free, best_row), cols, nc), axis=0)
    # Dual update: reduced costs stay ≥ 0 and become 0 along the augmenting path.
    delta = jnp.where(settled & (rows != cur), min_val - dist, 0.0)
    u = jnp.where(rows == cur, u + min_val, u + delta)
    vr = vr - delta

    # Augment: walk the path back from the sink; each row takes the column it was reached
    # through (with that column's potential and costs), the last one, `best_row`, the sink.
    def flip_body(s, rows=rows, c=c, pred=pred, cur=cur):
      i, j, v_j, col4row, vr, a, done = s
      active = ~done
      old_col, old_v = _pick(col4row, i), _pick(vr, i)
      hit = active & (rows == i)
      col4row = jnp.where(hit, j, col4row)
      vr = jnp.where(hit, v_j, vr)
      col_cost = jnp.take_along_axis(c, jnp.clip(j, 0, nc - 1)[None, None, :], axis=1)
      a = jnp.where(hit[None], col_cost, a)  # a[s, i] = cost[s, j]
      at_root = i == cur
      return (jnp.where(active & ~at_root, _pick(pred, i), i), jnp.where(active, old_col, j),
              jnp.where(active, old_v, v_j), col4row, vr, a, done | at_root)

    init = (best_row, sink, jnp.zeros((N,), jnp.float32), col4row, vr, a,
            jnp.zeros((N,), bool))
    _, _, _, col4row, vr, a, _ = _bounded_while(lambda s: jnp.any(~s[-1]), flip_body, init,
                                                n + 1)
    taken = jnp.where(cols == sink, inf, taken)
  return col4row, u, vr


def _bounded_while(cond, body, init, max_steps: int):
  """`lax.while_loop(cond, body, init)`, stopped after `max_steps` passes."""
  _, out = jax.lax.while_loop(lambda s: (s[0] < max_steps) & cond(s[1]),
                              lambda s: (s[0] + 1, body(s[1])), (jnp.int32(0), init))
  return out


def matched_weights(weights: jax.Array, matching: Matching):
  """Weight of each row's and each column's matched pair (0 if unmatched): [N, m], [N, n]."""
  w = jnp.asarray(weights, jnp.float32)
  r2c, c2r = matching.row_to_col, matching.col_to_row
  per_row = jnp.take_along_axis(w, jnp.maximum(r2c, 0)[:, :, None], axis=2)[:, :, 0]
  per_col = jnp.take_along_axis(w, jnp.maximum(c2r, 0)[:, None, :], axis=1)[:, 0, :]
  return jnp.where(r2c >= 0, per_row, 0.0), jnp.where(c2r >= 0, per_col, 0.0)
