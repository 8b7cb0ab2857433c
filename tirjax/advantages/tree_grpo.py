"""Tree-GRPO: advantages relative to the rows of the same tree and of all the query's trees
(spec §4.4).

Ji et al. 2025, "Tree Search for LLM Agent Reinforcement Learning" (Tree-GRPO): each query
grows M trees whose nodes are whole agent steps; a leaf's advantage is the sum of its z-score
among the leaves of its own tree (intra-tree, a process signal from the shared prefixes) and
among the leaves of all the query's trees (inter-tree, GRPO's). Here the trees are those of
PORTool's sampler (rollout mode "tree", Algorithm 1's selection kept): the query's n first steps
are drawn independently, like Tree-GRPO's M initial chains, and each first step roots one tree,
so a row's tree is its first node. With independent rollouts every tree is one row and
Tree-GRPO is GRPO.

One difference from Tree-GRPO's code, declared: a tree of one row has no intra-tree spread.
spec §3 gives such a group 0 (`ZScore.singleton="zero"`, the default), so independent rows give
GRPO exactly; Tree-GRPO's code returns the raw reward there, so three independent rows with
R = (1, 0, 0) get (1.155, −0.577, −0.577) here and (2.155, −0.577, −0.577) in its code.
`TreeGRPOOptions(zscore=ZScore(singleton="raw"))` reproduces the code's figures.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from tirjax import segments
from tirjax.advantages.group import broadcast_rows, group_zscore
from tirjax.advantages.registry import Advantages, register
from tirjax.rollouts import Rollouts


@dataclasses.dataclass(frozen=True)
class TreeGRPOOptions:
  zscore: segments.ZScore = segments.ZScore()  # conventions of both z-scores (spec §3)

  def __post_init__(self):
    if not isinstance(self.zscore, segments.ZScore):
      raise ValueError(f"zscore: must be a segments.ZScore, got {type(self.zscore).__name__}")


def tree_of_rows(r: Rollouts):
  """([B] tree key, [B] bool has a tree): the node of each row's first step; a row without
  steps belongs to no tree (its intra-tree term is 0)."""
  first = r.node_id[:, 0]
  has_tree = r.row_valid & r.step_valid[:, 0]
  return jnp.where(has_tree, first, 0), has_tree


@register("tree_grpo", TreeGRPOOptions, spec="4.4", group_normalised=True,
          rollout=dict(mode="tree",
          tree=dict(branch_factor=2)),
          reference="tirjax.testing.reference.agentic:tree_grpo")
def tree_grpo(r: Rollouts, opts: TreeGRPOOptions) -> Advantages:
  """Tree-GRPO: A_j = z(R_out_j among the rows of its tree) + z(R_out_j among the query's rows).

  Ji et al. 2025, §3 (intra-tree plus inter-tree group-relative advantages, summed); both
  z-scores follow spec §3, so a tree of one row (and a row without steps) adds 0.
  """
  tree, has_tree = tree_of_rows(r)
  intra = segments.zscore(r.outcome, tree, has_tree, r.num_rows * r.max_steps, opts.zscore)
  inter = group_zscore(r, r.outcome, opts.zscore)
  return broadcast_rows(r, intra + inter, r.outcome, intra_tree=intra, inter_tree=inter)
