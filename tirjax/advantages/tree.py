"""Rollout-tree topology from `node_id`, as segment ids over steps (spec §4.1).

Step t of row b is node `node_id[b, t]` at depth t + 1; its parent is node `node_id[b, t-1]`,
or, for t = 0, the root of the row's query. Parents live in a space of `B*T + B` segment ids:
node ids `[0, B*T)` for inner nodes and `B*T + group_id` for the roots, so that "the children
of p" is a segment keyed by `parent`. A node is carried by every row through it (|m(s)| steps
share its id); `first` marks one step per node so that per-node statistics count it once.
No reshape to [Q, G] and no loop over rows or nodes: everything is a segment operation.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from tirjax import segments
from tirjax.rollouts import Rollouts


class Tree(NamedTuple):
  """The rollout trees of a batch. Segment arrays are indexed by parent segment id."""

  parent: jax.Array  # [B, T] int32 parent segment of each step (a root id on padding steps)
  first: jax.Array  # [B, T] bool, exactly one step per node: the one of its lowest row
  num_children: jax.Array  # [B*T + B] f32 |C(p)|
  rows_through: jax.Array  # [B*T + B] f32 |m(p)|; a root is passed by every valid row of its query
  num_forks: jax.Array  # [B] f32 n_forks(q) per group id (the root counts when it is a fork)

  @property
  def is_fork(self) -> jax.Array:
    """[B*T + B] bool: the segment is a fork, a node (or root) with two or more children."""
    return self.num_children >= 2


def num_parent_segments(r: Rollouts) -> int:
  return r.num_rows * r.max_steps + r.num_rows


def root_ids(r: Rollouts) -> jax.Array:
  """[B] the parent segment id of each row's query root."""
  return r.num_rows * r.max_steps + r.group_id


def rollout_tree(r: Rollouts) -> Tree:
  """Parents, one representative step per node, child and row counts, forks per query."""
  B, T = r.num_rows, r.max_steps
  num_nodes, num_parents = B * T, num_parent_segments(r)
  nid, sv = r.node_id, r.step_valid
  root = jnp.broadcast_to(root_ids(r)[:, None], (B, T))
  parent = jnp.where(sv, jnp.concatenate([root[:, :1], nid[:, :-1]], axis=1), root)

  rows = jnp.broadcast_to(jnp.arange(B)[:, None], (B, T))
  lowest = segments.segment_min(rows, nid, sv, num_nodes)
  first = sv & (segments.gather(lowest, nid) == rows)

  num_children = segments.segment_count(parent, first, num_parents)
  rows_through = jnp.concatenate([segments.segment_count(nid, sv, num_nodes),
                                  segments.segment_count(r.group_id, r.row_valid, B)])
  fork = num_children >= 2
  groups = jnp.broadcast_to(r.group_id[:, None], (B, T))
  inner_forks = segments.segment_count(groups, first & segments.gather(fork, nid), B)
  num_forks = inner_forks + fork[num_nodes:].astype(jnp.float32)
  return Tree(parent=parent, first=first, num_children=num_children,
              rows_through=rows_through, num_forks=num_forks)


def parent_is_fork(r: Rollouts, tree: Tree) -> jax.Array:
  """[B, T] bool: the step is a child of a fork (valid steps only)."""
  return r.step_valid & segments.gather(tree.is_fork, tree.parent)


def node_value(x: jax.Array, r: Rollouts, tree: Tree) -> jax.Array:
  """[B, T] the value of `x` at each node's `first` step, read back at every step of the node.

  For values that every row of a node carries alike (its format reward) or that only the
  `first` step holds (a per-node statistic taken over `first` steps).
  """
  chex.assert_equal_shape([x, r.node_id])
  num_nodes = r.num_rows * r.max_steps
  return segments.gather(segments.segment_sum(x, r.node_id, tree.first, num_nodes), r.node_id)
