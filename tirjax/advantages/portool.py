"""PORTool: rewarded rollout trees with fork-relative advantages (spec §4.1).

PORTool ("Importance-Aware Policy Optimization with Rewarded Tree for Multi-Tool-Integrated
Reasoning") §3: Eq. 2 step reward, Eq. 3 advantages, the κ rescaling of the fork term. Every
statistic is a segment operation over node ids (`tree.py`), so ragged groups
and irregular trees need no reshape and the kernel jits once per padded shape.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import chex
import jax
import jax.numpy as jnp

from tirjax import option_checks, segments
from tirjax.advantages import tree as tree_lib
from tirjax.advantages.group import broadcast_steps, group_zscore
from tirjax.advantages.registry import Advantages, register
from tirjax.rollouts import Rollouts


@dataclasses.dataclass(frozen=True)
class PORToolOptions:
  """spec §4.1 options; defaults are the spec's.

  Attributes:
    gamma: decay γ of the outcome term γ^(T_k − t) · R_out(τ_k).
    omega1: weight ω1 of the trajectory-relative advantage.
    omega2: weight ω2 of the fork-relative advantage.
    tree_aggregation: G of Eq. 2: "adaptive" (max at a fork whose children's max-aggregated
      outcome terms differ, mean where they tie), or always "max" / "mean".
    shared_step_trj: Ā_trj of a step: "mean" of A_trj over the rows through it (one advantage
      per shared step), or the carrying row's "own" A_trj.
    fork_scale: κ(p) = n(q) / (|m(p)| · n_forks(q)) ("per_fork"), or 1 ("none").
    tie_tol: two max-aggregated outcome terms closer than this count as equal.
    zscore: group-normalisation conventions of both z-scores (spec §3).
  """

  gamma: float = 0.95
  omega1: float = 1.0
  omega2: float = 1.0
  tree_aggregation: Literal["adaptive", "max", "mean"] = "adaptive"
  shared_step_trj: Literal["mean", "own"] = "mean"
  fork_scale: Literal["per_fork", "none"] = "per_fork"
  tie_tol: float = 1e-6
  zscore: segments.ZScore = segments.ZScore()

  def __post_init__(self):
    option_checks.lies_in("gamma", self.gamma, 0, 1)
    option_checks.finite_at_least("omega1", self.omega1, 0)
    option_checks.finite_at_least("omega2", self.omega2, 0)
    option_checks.typed_choices(self)
    option_checks.finite_at_least("tie_tol", self.tie_tol, 0)
    if not isinstance(self.zscore, segments.ZScore):
      raise ValueError(f"zscore: must be a segments.ZScore, got {type(self.zscore).__name__}")


def outcome_terms(r: Rollouts, gamma: float) -> jax.Array:
  """[B, T] γ^(T_k − t) · R_out(τ_k) of row k at its step of depth t (1-based), 0 on padding."""
  depth = jnp.arange(1, r.max_steps + 1, dtype=jnp.int32)[None, :]
  exponent = jnp.maximum(r.num_steps[:, None] - depth, 0)
  return jnp.where(r.step_valid, gamma ** exponent * r.outcome[:, None], 0.0)


def node_max(x: jax.Array, r: Rollouts) -> jax.Array:
  """[B, T] max of `x` over the steps of each step's node, i.e. over the rows m(s)."""
  chex.assert_equal_shape([x, r.node_id])
  num_nodes = r.num_rows * r.max_steps
  return segments.gather(segments.segment_max(x, r.node_id, r.step_valid, num_nodes), r.node_id)


def node_mean(x: jax.Array, r: Rollouts) -> jax.Array:
  """[B, T] mean of `x` over the steps of each step's node, i.e. over the rows m(s)."""
  chex.assert_equal_shape([x, r.node_id])
  num_nodes = r.num_rows * r.max_steps
  return segments.gather(segments.segment_mean(x, r.node_id, r.step_valid, num_nodes),
                         r.node_id)


def aggregated_outcome(r: Rollouts, tree: tree_lib.Tree, opts: PORToolOptions) -> jax.Array:
  """[B, T] G_{k ∈ m(s)} [γ^(T_k − t) · R_out(τ_k)], the first term of Eq. 2.

  Adaptive G (spec §4.1) is decided per parent p: if the max-aggregated terms of p's children
  differ by more than `tie_tol`, every child uses max, otherwise every child uses mean. A
  node whose parent has one child is compared with itself only, so it uses mean.
  """
  terms = outcome_terms(r, opts.gamma)
  best = node_max(terms, r)
  if opts.tree_aggregation == "max":
    return best
  mean = node_mean(terms, r)
  if opts.tree_aggregation == "mean":
    return mean
  num_parents = tree_lib.num_parent_segments(r)
  spread = (segments.segment_max(best, tree.parent, r.step_valid, num_parents) -
            segments.segment_min(best, tree.parent, r.step_valid, num_parents))
  return jnp.where(segments.gather(spread, tree.parent) > opts.tie_tol, best, mean)


def step_reward(r: Rollouts, tree: tree_lib.Tree, opts: PORToolOptions) -> jax.Array:
  """[B, T] R(s) = G_{k ∈ m(s)}[γ^(T_k − t) · R_out(τ_k)] + R_fm(s) (PORTool Eq. 2).

  R_fm(s) is read from the node's first row: rows that share a node share its step.
  """
  fm = tree_lib.node_value(r.format_reward, r, tree)
  return jnp.where(r.step_valid, aggregated_outcome(r, tree, opts) + fm, 0.0)


def fork_advantage(r: Rollouts, tree: tree_lib.Tree, reward: jax.Array,
                   opts: segments.ZScore) -> jax.Array:
  """[B, T] A_fork(s) = norm(R(s), {R(s') : s' ∈ C(p)}), 0 when the parent p is not a fork.

  PORTool Eq. 3: each child of p counts once in its z-score, however many rows carry it.
  """
  chex.assert_equal_shape([reward, r.step_valid])
  chex.assert_type(reward, float)
  z = segments.zscore(reward, tree.parent, tree.first, tree_lib.num_parent_segments(r), opts)
  return jnp.where(tree_lib.parent_is_fork(r, tree), tree_lib.node_value(z, r, tree), 0.0)


def shared_trajectory_advantage(r: Rollouts, a_trj: jax.Array, mode: str) -> jax.Array:
  """[B, T] Ā_trj(s): mean of A_trj(τ_k) over k ∈ m(s) ("mean"), or the row's own ("own")."""
  chex.assert_shape(a_trj, r.row_valid.shape)  # [B]
  own = jnp.broadcast_to(a_trj[:, None], r.step_valid.shape)
  return own if mode == "own" else node_mean(own, r)


def fork_scale(r: Rollouts, tree: tree_lib.Tree) -> jax.Array:
  """[B, T] κ(p) = n(q) / (|m(p)| · n_forks(q)) of each step's parent p (spec §4.1).

  Rescales the fork term from trajectory-averaging to fork-averaging; with independent
  rollouts the root is the only fork and κ = 1. Meaningful where the parent is a fork.
  """
  n = segments.gather(tree.rows_through, tree_lib.root_ids(r))
  forks = segments.gather(tree.num_forks, r.group_id)
  through_parent = segments.gather(tree.rows_through, tree.parent)
  return n[:, None] / jnp.maximum(through_parent * forks[:, None], 1.0)


@register("portool", PORToolOptions, spec="4.1", group_normalised=True,
          rollout=dict(mode="tree",
          tree=dict(branch_factor=2)),
          reference="tirjax.testing.reference.portool:portool")
def portool(r: Rollouts, opts: PORToolOptions) -> Advantages:
  """PORTool step advantages (PORTool Eq. 3 with the κ rescaling; spec §4.1).

  A(s_{j,t}) = ω1 · Ā_trj(s) + ω2 · κ(p) · A_fork(s), with A_trj(τ_j) the z-score of
  R_out(τ_j) among the query's rows and A_fork(s) the z-score of the step reward R(s) (Eq. 2)
  among the children of its parent p.
  """
  tree = tree_lib.rollout_tree(r)
  reward = step_reward(r, tree, opts)
  a_trj = group_zscore(r, r.outcome, opts.zscore)
  a_fork = fork_advantage(r, tree, reward, opts.zscore)
  parent_fork = tree_lib.parent_is_fork(r, tree)
  kappa = fork_scale(r, tree) if opts.fork_scale == "per_fork" else jnp.ones_like(a_fork)
  kappa = jnp.where(parent_fork, kappa, 0.0)
  steps = (opts.omega1 * shared_trajectory_advantage(r, a_trj, opts.shared_step_trj) +
           opts.omega2 * kappa * a_fork)
  return broadcast_steps(
      r, steps, a_trj, r.outcome,
      node_reward=reward, a_trj=a_trj, a_fork=a_fork, kappa=kappa, parent_fork=parent_fork,
      is_fork=r.step_valid & segments.gather(tree.is_fork, r.node_id),
      num_forks=jnp.where(r.row_valid, segments.gather(tree.num_forks, r.group_id), 0.0))
