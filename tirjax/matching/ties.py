"""spec §4.2's tie rule for the exact matcher: the lexicographically smallest optimal matching.

Among the maximum-weight matchings, the one returned gives each ground-truth call, in
ground-truth order, the earliest predicted call it can have (unmatched ranks last): the
smallest vector (π(0), π(1), …) of matched positions. Without a rule, which optimal matching
a solver returns is an accident of its search order (scipy and the batched kernel disagreed
on ~5% of HiDiffTIR groups), and the turn rewards, hence the advantages, follow it.

Fixing the ground-truth calls one at a time, in order, each to the earliest predicted call
that still allows an optimal matching, yields that vector. Each test reads the optimal duals
of the assignment (`hungarian._assign`, ground-truth calls as its rows, every row assigned,
columns free or used): in the residual network of the assignment as a flow to a sink t —
arcs row→column at reduced cost `rc = cost − u − v ≥ 0`, used column→its row at 0, free
column→t at 0, t→used column j at −v_j ≥ 0 — the best assignment with g on column p costs
more than the optimum by the shortest cycle through the arc g→p, that is by `rc(g, p)` plus
the shortest path from p back to g's own column (Ahuja, Magnanti & Orlin 1993, §9.3: reduced
costs and negative-cycle optimality). One Dijkstra over the ≤ C rows and t, backwards from
g's column, gives that for every p at once; the chosen cycle is rotated in (the duals stay
optimal), and the next row is tested the same way.

A tie is a cost within `TIE_TOLERANCE` of 0: similarities are ratios of small integers, so
two matchings of different true weight differ by far more, while float32 sums of equal
weights may differ in the last bits.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

TIE_TOLERANCE = 1e-5
_END = -1  # the path reaches g's own column


def _take(x, idx):
  """x[b, idx[b]] for x [N, k] and idx [N] (idx clipped into range)."""
  return jnp.take_along_axis(x, jnp.clip(idx, 0, x.shape[1] - 1)[:, None], axis=1)[:, 0]


def lexicographic_fix(cost: jax.Array, col4row: jax.Array, u: jax.Array,
                      v_col: jax.Array, group: int = 32) -> jax.Array:
  """The lexicographically smallest optimal assignment, from an optimal one and its duals.

  Only problems that may change are fixed: no row moves unless some row g has a tight arc
  (reduced cost ≤ `TIE_TOLERANCE`) to a matched column earlier than its own, for the first
  row to move sees the assignment as given. Those problems are gathered and fixed `group` at
  a time, so the cost follows the number of ties, not the batch.

  Args: as `fix_all`. Returns: as `fix_all`.
  """
  N, n, m = cost.shape
  cols = jnp.arange(m, dtype=jnp.int32)
  rc = cost - u[:, :, None] - v_col[:, None, :]
  rank = jnp.where(jnp.take_along_axis(cost, col4row[:, :, None], axis=2)[:, :, 0] < 0,
                   col4row, m)
  need = jnp.any((cost < 0) & (rc <= TIE_TOLERANCE) & (cols[None, None, :] < rank[:, :, None]),
                 axis=(1, 2))
  count = jnp.sum(need, dtype=jnp.int32)
  order = jnp.nonzero(need, size=N, fill_value=0)[0].astype(jnp.int32)
  group = max(1, min(group, N))
  order = jnp.pad(order, (0, group))

  def body(k, out):
    idx = jax.lax.dynamic_slice_in_dim(order, k * group, group)
    ok = k * group + jnp.arange(group) < count
    fixed = fix_all(cost[idx], out[idx], u[idx], v_col[idx])
    return out.at[jnp.where(ok, idx, N)].set(fixed, mode="drop")

  return jax.lax.fori_loop(0, -(-count // group), body, col4row)


def fix_all(cost: jax.Array, col4row: jax.Array, u: jax.Array, v_col: jax.Array) -> jax.Array:
  """The lexicographically smallest optimal assignment of every problem of the batch.

  Args:
    cost: [N, n, m] assignment costs (−weight; 0 on padding), rows = ground-truth calls in
      order, columns = predicted calls in order, n ≤ m.
    col4row: [N, n] an optimal assignment (every row has a column).
    u: [N, n] row potentials, and v_col: [N, m] column potentials (≤ 0; 0 on free columns),
      with reduced costs `cost − u − v` ≥ 0 and 0 on the assignment.

  Returns:
    [N, n] the column of each row in the lexicographically smallest optimal assignment, where
    a row on a column of cost ≥ 0 (weight ≤ 0: unmatched) ranks after every matched column.
  """
  N, n, m = cost.shape
  big = jnp.float32(jnp.inf)
  rows = jnp.arange(n, dtype=jnp.int32)
  cols = jnp.arange(m, dtype=jnp.int32)
  sink = n  # node index of t among the n + 1 nodes of the search
  rc = jnp.maximum(cost - u[:, :, None] - v_col[:, None, :], 0.0)  # [N, n, m]
  minus_v = jnp.maximum(-v_col, 0.0)  # t → used column j
  positive = cost < 0.0  # matched pairs (weight > 0)
  fixed = jnp.zeros((N, n), bool)
  floating = jnp.zeros((N, n), bool)  # fixed as unmatched: may move between weight-0 columns

  for g in range(n):
    owner = jnp.max(jnp.where(col4row[:, :, None] == cols[None, None, :], rows[None, :, None],
                              -1), axis=1)  # [N, m] the row on each column, or -1 (free)
    old = col4row[:, g]
    movable = (~fixed | floating) & (rows[None, :] != g)
    rc_move = jnp.where(floating[:, :, None] & positive, big, rc)
    seat_cost = jnp.take_along_axis(rc_move, col4row[:, None, :].repeat(n, 1), axis=2)
    # seat_cost[r, s]: row r onto row s's column; free_best[r]: row r onto its best free column.
    free_move = jnp.where((owner < 0)[:, None, :], rc_move, big)
    free_best, free_col = jnp.min(free_move, axis=2), jnp.argmin(free_move, axis=2)
    leave = _take(minus_v, old)  # t → g's column: that column is left free
    leave_s = jnp.take_along_axis(minus_v, col4row, axis=1)  # t → row s's column

    # Backward Dijkstra to g's column over the movable rows and t: dist[k] = cheapest path
    # from node k to g's column; nxt[k] = the node after k (_END: g's column itself).
    dist = jnp.concatenate([jnp.where(movable, _take_cols(rc_move, old), big),
                            leave[:, None]], axis=1)  # [N, n + 1]
    nxt = jnp.full((N, n + 1), _END, jnp.int32)
    live = jnp.concatenate([movable, jnp.ones((N, 1), bool)], axis=1)

    def relax(_, s, seat_cost=seat_cost, free_best=free_best, leave_s=leave_s, live=live,
              movable=movable):
      dist, nxt, settled = s
      key = jnp.where(live & ~settled, dist, big)
      k = jnp.argmin(key, axis=1).astype(jnp.int32)
      d_k = _take(key, k)
      ok = d_k < big
      settled = settled | (ok[:, None] & (jnp.arange(n + 1)[None, :] == k[:, None]))
      k_row = k < n
      # Into row k (on row k's column), or into t (onto a free column).
      via_rows = jnp.where(k_row[:, None], _take_cols(seat_cost, k), free_best) + d_k[:, None]
      via_sink = jnp.where(k_row, _take(leave_s, k) + d_k, big)
      via = jnp.concatenate([jnp.where(movable, via_rows, big), via_sink[:, None]], axis=1)
      better = ok[:, None] & live & ~settled & (via < dist)
      return jnp.where(better, via, dist), jnp.where(better, k[:, None], nxt), settled

    dist, nxt, _ = jax.lax.fori_loop(0, n + 1, relax,
                                     (dist, nxt, jnp.zeros((N, n + 1), bool)))

    # Extra cost of g on column p: p free (then on through t), or p's row moves on.
    owner_movable = (owner >= 0) & jnp.take_along_axis(movable, jnp.maximum(owner, 0), axis=1)
    after_p = jnp.where(owner < 0, dist[:, sink:],
                        jnp.where(owner_movable,
                                  jnp.take_along_axis(dist, jnp.maximum(owner, 0), axis=1), big))
    extra = rc[:, g, :] + after_p
    rank_old = jnp.where(_take(positive[:, g, :], old), old, m)
    wanted = positive[:, g, :] & (extra <= TIE_TOLERANCE) & (cols[None, :] < rank_old[:, None])
    move = jnp.any(wanted, axis=1)
    target = jnp.min(jnp.where(wanted, cols[None, :], m), axis=1)

    # Rotate the cycle in: g onto target, then each node of the path after it.
    start = jnp.where(_take(owner, target) >= 0, _take(owner, target), sink)
    new = jnp.where(move[:, None] & (rows[None, :] == g), target[:, None], col4row)
    walker = jnp.where(move, start, _END)

    def rotate(_, s, col4row=col4row, nxt=nxt, free_col=free_col):
      new, k = s
      at_row = (k >= 0) & (k < n)
      after = _take(nxt, k)
      seat = jnp.where(after == _END, old,
                       jnp.where(after == sink, _take(free_col, k), _take(col4row, after)))
      new = jnp.where(at_row[:, None] & (rows[None, :] == k[:, None]), seat[:, None], new)
      return new, jnp.where(k >= 0, after, _END)

    col4row, _ = jax.lax.fori_loop(0, 2 * n + 2, rotate, (new, walker))
    fixed = fixed | (rows[None, :] == g)
    matched = _take(positive[:, g, :], col4row[:, g])
    floating = floating | ((rows[None, :] == g) & ~matched[:, None])
  return col4row


def _take_cols(x, idx):
  """x[b, :, idx[b]] for x [N, n, k] and idx [N]."""
  return jnp.take_along_axis(x, jnp.clip(idx, 0, x.shape[2] - 1)[:, None, None].repeat(
      x.shape[1], 1), axis=2)[:, :, 0]
