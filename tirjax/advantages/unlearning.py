"""Unlearning diagnostic (SPEC §4.1, after PORTool's Theorem 3.1), for any estimator.

A step s with parent p is *necessary* when p is a fork, at least one correct leaf (a row with
R_out = +1) lies below p, and every correct leaf below p passes through s: without s no
correct answer was reached from p. An estimator "unlearns" a necessary step when it gives it
a negative advantage. Counting correct rows through each node against those through its
parent decides necessity with segment sums, no loop over nodes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tirjax import segments
from tirjax.advantages import tree as tree_lib
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


@jax.jit
def unlearning_rate(r: Rollouts, step_adv: jax.Array) -> dict[str, jax.Array]:
  """Fraction of necessary steps that receive a negative advantage.

  Each necessary node counts once. An estimator may give the rows that share a node different
  step advantages (GRPO broadcasts each row's own; PORTool with `shared_step_trj="own"`), so
  the node's advantage is their mean over the rows that carry it: the net direction in which
  one update moves that step's tokens, which every such row repeats. Rate 0 when there is no
  necessary step. `row_rate` counts instead every (row, necessary step) pair with its own
  advantage, the reading under which "own" visibly unlearns (SPEC §4.1).

  Args:
    r: the batch.
    step_adv: [B, T] step advantages of any estimator (`Advantages.steps`).

  Returns:
    dict of scalars: rate (f32), num_necessary and num_negative (int32, nodes), row_rate (f32).
  """
  tree = tree_lib.rollout_tree(r)
  num_nodes = r.num_rows * r.max_steps
  node_adv = segments.gather(segments.segment_mean(step_adv, r.node_id, r.step_valid, num_nodes),
                             r.node_id)
  necessary = necessary_steps(r)
  counted = necessary & tree.first
  num_necessary = jnp.sum(counted, dtype=jnp.int32)
  num_negative = jnp.sum(counted & (node_adv < 0.0), dtype=jnp.int32)
  row_negative = jnp.sum(necessary & (step_adv < 0.0))
  return dict(rate=_ratio(num_negative, num_necessary), num_necessary=num_necessary,
              num_negative=num_negative, row_rate=_ratio(row_negative, jnp.sum(necessary)))


def _ratio(count, total) -> jax.Array:
  return (count / jnp.maximum(total, 1)).astype(jnp.float32)
