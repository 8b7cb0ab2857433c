"""Unlearning diagnostic (spec §4.1, after PORTool's Theorem 3.1), for any estimator.

A step s with parent p is *necessary* when p is a fork, at least one correct leaf (a row with
R_out = +1) lies below p, and every correct leaf below p passes through s: without s no
correct answer was reached from p. An estimator "unlearns" a necessary step when the gradient
pushes the step's tokens down: its *net push*, Σ over the rows k through s of (row k's loss
weight on the step's tokens) × A(s, k), is negative. Counting correct rows through each node
against those through its parent decides necessity with segment sums, no loop over nodes.
"""

from __future__ import annotations

import functools
from typing import Optional

import chex
import jax
import jax.numpy as jnp

from tirjax import segments
from tirjax.advantages import tree as tree_lib
from tirjax.loss import aggregation as aggregation_modes
from tirjax.rollouts import Rollouts


def necessary_steps(r: Rollouts) -> jax.Array:
  """[B, T] bool: step t of row b is a necessary step (True on every row through it).

  necessary(s) ⇔ p is a fork ∧ c(p) ≥ 1 ∧ c(s) = c(p), with c(x) the number of correct rows
  through x (for the root: the query's correct rows) and p the parent of s.
  """
  tree = tree_lib.rollout_tree(r)
  B, T = r.num_rows, r.max_steps
  correct = (r.row_valid & (r.outcome == 1.0)).astype(jnp.float32)
  through_node = segments.segment_sum(jnp.broadcast_to(correct[:, None], (B, T)), r.node_id,
                                      r.step_valid, B * T)
  through_root = segments.segment_sum(correct, r.group_id, r.row_valid, B)
  through = jnp.concatenate([through_node, through_root])
  c_step = segments.gather(through_node, r.node_id)
  c_parent = segments.gather(through, tree.parent)
  return tree_lib.parent_is_fork(r, tree) & (c_parent >= 1.0) & (c_step == c_parent)


def step_loss_weights(r: Rollouts, aggregation: str = "seq_mean_token_mean",
                      row_mask: Optional[jax.Array] = None) -> jax.Array:
  """[B, T] each row's weight in the loss on the tokens of each of its steps, up to a positive
  factor shared by all rows: `n_{k,t} · f_k`, with `n_{k,t}` the step's tokens in the loss mask
  and `f_k = 1/|τ_k|` under a mode that averages within each row (`mean_within_row` of its
  record in `tirjax.loss.aggregation.MODES`: `seq_mean_token_mean`, every row weighs the same),
  1 under the others (every token weighs the same; their divisors are common to all rows).
  Rows outside `row_mask` (e.g. groups DAPO filtered) weigh 0.

  Raises:
    ValueError: an aggregation without a record.
  """
  rule = aggregation_modes.lookup(aggregation)  # a mode without a record fails here
  B, T = r.num_rows, r.max_steps
  in_loss = r.loss_mask.astype(bool) & (r.token_step >= 0)
  flat_ids = jnp.arange(B)[:, None] * T + jnp.clip(r.token_step, 0, T - 1)
  counts = segments.segment_sum(in_loss.astype(jnp.float32), flat_ids, in_loss,
                                B * T).reshape(B, T)
  if rule.mean_within_row:
    length = jnp.sum(r.loss_mask.astype(jnp.float32), axis=1)
    counts = counts / jnp.maximum(length, 1.0)[:, None]
  keep = r.row_valid if row_mask is None else r.row_valid & row_mask.astype(bool)
  return jnp.where(keep[:, None] & r.step_valid, counts, 0.0)


@functools.partial(jax.jit, static_argnames="aggregation")
def unlearning_rate(r: Rollouts, step_adv: jax.Array, aggregation: str = "seq_mean_token_mean",
                    row_mask: Optional[jax.Array] = None) -> dict[str, jax.Array]:
  """Fraction of necessary steps whose net push is negative (spec §4.1's headline).

  Each necessary node s counts once, as unlearned when
  `Σ_{k ∈ m(s)} w_{k,s} · A(s, k) < 0`, with `w` the rows' loss weights on the step's tokens
  (`step_loss_weights` under `aggregation`): what one update does to the step's tokens, which
  every row through s carries. An estimator may give those rows different step advantages
  (GRPO broadcasts each row's own; PORTool with `shared_step_trj="own"`). Rate 0 when there is
  no necessary step. `row_rate` counts instead every (row, necessary step) pair with a negative
  advantage of its own, the reading under which "own" visibly unlearns.

  Args:
    r: the batch.
    step_adv: [B, T] step advantages of any estimator (`Advantages.steps`).
    aggregation: the loss's aggregation mode (`LossOptions.aggregation`).
    row_mask: [B] rows in the loss (`Advantages.row_mask`); None: every valid row.

  Returns:
    dict of scalars: rate (f32), num_necessary and num_negative (int32, nodes), row_rate (f32).
  """
  chex.assert_shape(step_adv, (r.num_rows, r.max_steps))
  tree = tree_lib.rollout_tree(r)
  num_nodes = r.num_rows * r.max_steps
  weights = step_loss_weights(r, aggregation, row_mask)
  push = segments.gather(segments.segment_sum(weights * step_adv, r.node_id, r.step_valid,
                                              num_nodes), r.node_id)
  necessary = necessary_steps(r)
  counted = necessary & tree.first
  num_necessary = jnp.sum(counted, dtype=jnp.int32)
  num_negative = jnp.sum(counted & (push < 0.0), dtype=jnp.int32)
  row_negative = jnp.sum(necessary & (step_adv < 0.0))
  return dict(rate=_ratio(num_negative, num_necessary), num_necessary=num_necessary,
              num_negative=num_negative, row_rate=_ratio(row_negative, jnp.sum(necessary)))


def _ratio(count, total) -> jax.Array:
  return (count / jnp.maximum(total, 1)).astype(jnp.float32)
