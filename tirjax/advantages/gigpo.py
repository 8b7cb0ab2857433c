"""GiGPO: group-in-group policy optimization, step credit over anchor states (spec §4.4).

Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training" (verl-agent):
an episode-level group advantage (Eq. 3) plus a step-level advantage (Eq. 7) computed within
*anchor-state groups*, the steps of one query's rollouts that stand in the same environment
state (Eq. 6), combined as A = A^E + ω · A^S (Eq. 8). No tree and no extra rollout: the step
groups are found after the fact among independent rollouts, which makes GiGPO the step-level
comparator of PORTool (which branches on purpose) and HiDiffTIR (which matches calls).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax.numpy as jnp

from tirjax import option_checks, segments
from tirjax.advantages import tree as tree_lib
from tirjax.advantages.group import broadcast_steps, group_zscore
from tirjax.advantages.portool import outcome_terms
from tirjax.advantages.registry import Advantages, register
from tirjax.rollouts import Rollouts


@dataclasses.dataclass(frozen=True)
class GiGPOOptions:
  """Defaults are the paper's and verl-agent's (γ = 0.95, ω = 1, "mean_std_norm"), except
  where `episode_stats` says.

  Attributes:
    gamma: γ of the step's discounted return γ^(T_j − t) · R_out (t 1-based; Eq. 5 with the
      outcome as the only reward).
    omega: ω, the weight of the step-level advantage.
    anchor: "state": steps with the same `Rollouts.state_id` (the same tool calls and
      responses so far, the policy's own text ignored); "prefix": steps with the same parent
      node (the same tokens so far; on independent rollouts only the first steps group).
    zscore: conventions of both z-scores; `scale="none"` is verl-agent's "mean_norm".
    episode_stats: over what the episode term's mean and std are taken. "trajectory" (the
      paper's Eq. 3): each trajectory of the group once. "step": each trajectory once per
      step it took, as verl-agent's shipped `episode_norm_reward` does
      (`compute_mean_std_cross_steps=True`, which its trainer never changes), so that long
      trajectories weigh more. A group with rows (R = 1, 1 step) and (R = 0, 3 steps) gets
      A^E = ±0.707 under "trajectory" and (1.5, −0.5) under "step".
  """

  gamma: float = 0.95
  omega: float = 1.0
  anchor: Literal["state", "prefix"] = "state"
  zscore: segments.ZScore = segments.ZScore()
  episode_stats: Literal["trajectory", "step"] = "trajectory"

  def __post_init__(self):
    option_checks.lies_in("gamma", self.gamma, 0, 1)
    option_checks.finite_at_least("omega", self.omega, 0)
    option_checks.typed_choices(self)
    if not isinstance(self.zscore, segments.ZScore):
      raise ValueError(f"zscore: must be a segments.ZScore, got {type(self.zscore).__name__}")


def anchor_segments(r: Rollouts, anchor: str):
  """([B, T] step-group key, number of keys) of each step: its anchor state, or its parent."""
  if anchor == "prefix":
    return tree_lib.rollout_tree(r).parent, tree_lib.num_parent_segments(r)
  if r.state_id is None:
    raise ValueError("gigpo: anchor='state' needs Rollouts.state_id (the episode runner "
                     "records it); anchor='prefix' groups steps by their parent node instead")
  return r.state_id, r.num_rows * r.max_steps


def episode_advantage(r: Rollouts, opts: GiGPOOptions):
  """A^E `[B]`: the z-score of R_out among the query's rows, each row counted once
  ("trajectory") or once per valid step ("step", verl-agent's)."""
  if opts.episode_stats == "trajectory":
    return group_zscore(r, r.outcome, opts.zscore)
  per_step = jnp.broadcast_to(r.outcome[:, None], r.step_valid.shape)
  group = jnp.broadcast_to(r.group_id[:, None], r.step_valid.shape)
  mask = r.step_valid & r.row_valid[:, None]
  z = segments.zscore(per_step, group, mask, r.num_rows, opts.zscore)
  # every step of a row holds the same z; a row without steps gets 0
  return jnp.sum(z, axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1)


@register("gigpo", GiGPOOptions, spec="4.4", group_normalised=True,
          reference="tirjax.testing.reference.agentic:gigpo")
def gigpo(r: Rollouts, opts: GiGPOOptions) -> Advantages:
  """GiGPO: A(s_{j,t}) = A^E(τ_j) + ω · A^S(s_{j,t}).

  A^E is the z-score of R_out among the query's rows; A^S the z-score of the step's
  discounted return γ^(T_j − t) R_out among the steps of its anchor-state group. Members are
  (row, step) pairs: on trees a shared node counts once per row through it, as its tokens do
  in the loss. A step group of one gets A^S = 0 (spec §3; verl-agent's mean of one gives 0 too).
  """
  episode = episode_advantage(r, opts)
  ret = outcome_terms(r, opts.gamma)
  key, num_keys = anchor_segments(r, opts.anchor)
  step = segments.zscore(ret, key, r.step_valid, num_keys, opts.zscore)
  size = segments.gather(segments.segment_count(key, r.step_valid, num_keys), key)
  steps = episode[:, None] + opts.omega * step
  return broadcast_steps(r, steps, episode, r.outcome, step_return=ret, step_advantage=step,
                         step_group_size=jnp.where(r.step_valid, size, 0.0))
