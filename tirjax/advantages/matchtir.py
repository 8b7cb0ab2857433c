"""MatchTIR: turn rewards from matched tool calls, dual-level advantages (spec §4.3).

Qu et al. 2026, "MatchTIR: Fine-Grained Supervision for Tool-Integrated Reasoning via
Bipartite Matching", as the HiDiffTIR paper runs it in two variants: per-call rewards from a
one-to-one matching (`matchtir_km`) or from entropic optimal transport (`matchtir_ot`). A
turn's reward is the mean of its calls' rewards, the answering step's is `answer_score`;
A_{i,k} = (A_traj(i) + A_turn(i, k)) / 2 with A_traj the group z-score of Σ_k r_{i,k} and
A_turn the z-score of the discounted return G_{i,k} among the query's rows at turn index k.
The public code (CyberSculptor96/MatchTIR, `Code/verl/trainer/ppo/core_algos.py`,
`compute_grpo_outcome_advantage`) computes exactly this with a discount of 0.9.
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np

from tirjax import option_checks, segments
from tirjax.advantages import turns
from tirjax.advantages.group import broadcast_steps
from tirjax.advantages.registry import Advantages, register
from tirjax.matching.sinkhorn import ot_call_rewards
from tirjax.rollouts import Rollouts


@dataclasses.dataclass(frozen=True)
class MatchTIRKMOptions:
  matching: str = "hungarian"  # exact; "greedy" is what the public MatchTIR code labels KM
  discount: float = 0.9  # γ of the turn-level discounted return
  zscore: segments.ZScore = segments.ZScore()

  def __post_init__(self):
    option_checks.one_of("matching", self.matching, turns.MATCHERS)
    option_checks.lies_in("discount", self.discount, 0, 1)


@dataclasses.dataclass(frozen=True)
class MatchTIROTOptions:
  reg: float = 0.1  # entropic regularisation of the Sinkhorn solver
  discount: float = 0.9  # γ of the turn-level discounted return
  max_iter: int = 1000  # Sinkhorn iteration cap (POT's default, as MatchTIR runs it)
  tol: float = 1e-6  # L1 error of the ground-truth marginal at which Sinkhorn stops
  zscore: segments.ZScore = segments.ZScore()

  def __post_init__(self):
    option_checks.above("reg", self.reg, 0)
    option_checks.int_at_least("max_iter", self.max_iter, 1)
    option_checks.at_least("tol", self.tol, 0)
    option_checks.lies_in("discount", self.discount, 0, 1)


def turn_rewards(r: Rollouts, call_reward: jax.Array) -> jax.Array:
  """r_{i,j}: mean reward of the turn's calls (0 without calls); answering step: answer_score."""
  chex.assert_rank(call_reward, 3)  # [B, T, K]
  chex.assert_equal_shape([call_reward, r.call_valid])
  reward = turns.turn_mean(call_reward, r.call_valid)
  reward = jnp.where(turns.answer_steps(r), r.answer_score[:, None], reward)
  return jnp.where(r.step_valid, reward, 0.0)


def discounted_returns(reward: jax.Array, discount: float) -> jax.Array:
  """G_{i,k} = Σ_{j ≥ k} γ^{j−k} r_{i,j}, [B, T] (reward 0 on padding steps)."""
  chex.assert_rank(reward, 2)
  chex.assert_type(reward, float)
  T = reward.shape[1]
  j, k = np.arange(T)[:, None], np.arange(T)[None, :]
  weights = np.where(j >= k, float(discount) ** np.maximum(j - k, 0), 0.0).astype(np.float32)
  return reward @ jnp.asarray(weights)


def dual_advantage(r: Rollouts, reward: jax.Array, discount: float, zopts: segments.ZScore,
                   **extras) -> Advantages:
  """A_{i,k} = (A_traj(i) + A_turn(i, k)) / 2 from turn rewards [B, T]."""
  total = jnp.sum(reward, axis=1)
  a_traj = segments.zscore(total, r.group_id, r.row_valid, r.num_rows, zopts)
  returns = discounted_returns(reward, discount)
  a_turn = turns.group_zscore_turns(r, returns, zopts)
  steps = 0.5 * (a_traj[:, None] + a_turn)
  return broadcast_steps(r, steps, a_traj, total, turn_reward=reward, turn_return=returns,
                         turn_advantage=a_turn, **extras)


@register("matchtir_km", MatchTIRKMOptions, spec="4.3", protocol="hidifftir",
          reference="tirjax.testing.reference.matching:matchtir_km")
def matchtir_km(r: Rollouts, opts: MatchTIRKMOptions) -> Advantages:
  """MatchTIR (KM): a call's reward is the similarity of its matched pair (0 if unmatched)."""
  match = turns.match_calls(r, opts.matching)
  reward = turn_rewards(r, match.call_reward)
  return dual_advantage(r, reward, opts.discount, opts.zscore, call_reward=match.call_reward,
                        gt_reward=match.gt_reward)


@register("matchtir_ot", MatchTIROTOptions, spec="4.3", protocol="hidifftir",
          reference="tirjax.testing.reference.matching:matchtir_ot")
def matchtir_ot(r: Rollouts, opts: MatchTIROTOptions) -> Advantages:
  """MatchTIR (OT): a call's reward is Σ_v T_uv · S_uv under the Sinkhorn plan T."""
  B, T, K, C = r.call_sim.shape
  call_reward = ot_call_rewards(r.call_sim.reshape(B, T * K, C),
                                r.call_valid.reshape(B, T * K), r.gt_valid, reg=opts.reg,
                                max_iter=opts.max_iter, tol=opts.tol).reshape(B, T, K)
  reward = turn_rewards(r, call_reward)
  return dual_advantage(r, reward, opts.discount, opts.zscore, call_reward=call_reward)
