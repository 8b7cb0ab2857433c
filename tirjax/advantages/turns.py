"""Calls → turns: the pieces shared by the matching-based estimators (spec §4.2-4.3).

A row's predicted calls are its [T, K] call slots flattened in (turn, slot) order, matched
against the query's C ground-truth calls (`call_sim` [B, T, K, C]). Turn statistics across a
group use the segment key `group_id * T + t` (one segment per query and turn index).
"""

from __future__ import annotations

import chex
import flax.struct
import jax
import jax.numpy as jnp

from tirjax import segments
from tirjax.matching.greedy import greedy_matching
from tirjax.matching.hungarian import Matching, matched_weights, max_weight_matching
from tirjax.rollouts import Rollouts

MATCHERS = {"hungarian": max_weight_matching, "greedy": greedy_matching}


@flax.struct.dataclass(frozen=True)
class CallMatch:
  """A one-to-one matching of each row's predicted calls to its ground-truth calls."""

  call_reward: jax.Array  # [B, T, K] similarity of the call's matched pair (0 if unmatched)
  call_gt: jax.Array  # [B, T, K] int32 matched ground-truth call, -1 if none
  gt_reward: jax.Array  # [B, C] r(c*): similarity of the call matched to c* (0 if none)
  gt_turn: jax.Array  # [B, C] int32 turn of the call matched to c*, -1 if none


def match_calls(r: Rollouts, method: str = "hungarian") -> CallMatch:
  """Matches all predicted calls of each row (all turns) to its ground-truth calls.

  `method` is "hungarian" (exact maximum weight, HiDiffTIR Eq. 2) or "greedy" (MatchTIR's).
  Pairs of similarity 0 count as unmatched.
  """
  B, T, K, C = r.call_sim.shape
  sim = r.call_sim.reshape(B, T * K, C)
  m: Matching = MATCHERS[method](sim, r.call_valid.reshape(B, T * K), r.gt_valid)
  per_call, per_gt = matched_weights(sim, m)
  return CallMatch(call_reward=per_call.reshape(B, T, K),
                   call_gt=m.row_to_col.reshape(B, T, K),
                   gt_reward=per_gt,
                   gt_turn=jnp.where(m.col_to_row >= 0, m.col_to_row // K, -1))


def turn_mean(call_values: jax.Array, call_valid: jax.Array) -> jax.Array:
  """Mean over each turn's calls, [B, T]; 0 for a turn without calls (HiDiffTIR Eq. 3)."""
  chex.assert_rank(call_values, 3)  # [B, T, K]
  chex.assert_equal_shape([call_values, call_valid])
  chex.assert_type(call_valid, bool)
  n = jnp.sum(call_valid, axis=2)
  total = jnp.sum(jnp.where(call_valid, call_values, 0.0), axis=2)
  return total / jnp.maximum(n, 1)


def answer_steps(r: Rollouts) -> jax.Array:
  """[B, T] bool: the answering step (the last step of a row that answered)."""
  t = jnp.arange(r.max_steps)[None, :]
  return r.answered[:, None] & (t == r.num_steps[:, None] - 1) & r.step_valid


def turn_segments(r: Rollouts):
  """Segment ids [B, T], mask [B, T] and count of the (query, turn index) segments."""
  T = r.max_steps
  ids = r.group_id[:, None] * T + jnp.arange(T, dtype=jnp.int32)[None, :]
  return ids, r.step_valid & r.row_valid[:, None], r.num_rows * T


def group_zscore_turns(r: Rollouts, x: jax.Array, opts: segments.ZScore) -> jax.Array:
  """z-score of x [B, T] among the rows of the same query at the same turn index."""
  chex.assert_equal_shape([x, r.step_valid])
  ids, mask, n = turn_segments(r)
  return segments.zscore(x, ids, mask, n, opts)


def gt_turn_segments(gt_turn: jax.Array, num_turns: int):
  """Segment ids [B, C] (row · T + turn), mask and count of the sets C*_{i,j}: the
  ground-truth calls matched to a call of turn j of row i."""
  chex.assert_rank(gt_turn, 2)  # [B, C]
  chex.assert_type(gt_turn, int)
  B = gt_turn.shape[0]
  ids = jnp.arange(B, dtype=jnp.int32)[:, None] * num_turns + gt_turn
  return ids, gt_turn >= 0, B * num_turns


def gt_group_sum(r: Rollouts, per_gt: jax.Array) -> jax.Array:
  """Sum of per_gt [B, C] over the rows of each query, per ground-truth call, read back at
  every row of the query (0 on padding)."""
  chex.assert_equal_shape([per_gt, r.gt_valid])  # [B, C]
  B, C = per_gt.shape
  ids = r.group_id[:, None] * C + jnp.arange(C, dtype=jnp.int32)[None, :]
  mask = r.row_valid[:, None] & r.gt_valid
  total = segments.segment_sum(per_gt, ids, mask, B * C)
  return jnp.where(mask, segments.gather(total, ids), 0.0)


def group_size(r: Rollouts) -> jax.Array:
  """|G(q)|: the number of valid rows of each row's query, [B]."""
  count = segments.segment_count(r.group_id, r.row_valid, r.num_rows)
  return segments.gather(count, r.group_id)
