"""HiDiffTIR: difficulty-aware hierarchical credit assignment (spec §4.2).

Guo et al. 2026, "HiDiffTIR": raw turn rewards from a maximum-weight matching of predicted to
ground-truth calls (§3.3, Eq. 1-3), reweighted by group-estimated difficulty and normalised
per turn index into a trajectory score and advantage (Eq. 4-11), then redistributed across
the row's turns by tool-selection success rate (§3.4, Eq. 12-16). spec §4.2 fixes what the
paper leaves open (answering step, flat min-max, empty sets); each choice is an option.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import chex
import jax
import jax.numpy as jnp

from tirjax import option_checks, segments
from tirjax.advantages import turns
from tirjax.advantages.group import broadcast_steps
from tirjax.advantages.registry import Advantages, register
from tirjax.rollouts import Rollouts

FLAT = 1e-6  # min-max spread below which a turn's rewards count as all equal (spec §4.2)


@dataclasses.dataclass(frozen=True)
class HiDiffTIROptions:
  """Options of `hidifftir`; defaults are the paper's (spec §4.2)."""

  alpha: float = 0.7  # α of Eq. 16: weight of the trajectory advantage in every turn
  lam: float = 1.0  # λ of Eq. 12, the smoothing constant
  answer_turn: Literal["judge", "none"] = "judge"  # the answering step's raw reward: answer_score, or its calls
  success_rate: Literal["as_printed", "smoothed"] = "as_printed"  # Eq. 12 as printed, or (count + λ) / (|G| + λ)
  trajectory_difficulty: bool = True  # False: R = Σ_j r (no reweighting, no min-max)
  turn_difficulty: bool = True  # False: A_{i,j} = A(τ_i)
  matching: str = "hungarian"  # exact (Eq. 2), or MatchTIR's greedy matcher
  zscore: segments.ZScore = segments.ZScore()

  def __post_init__(self):
    option_checks.lies_in("alpha", self.alpha, 0, 1)
    option_checks.above("lam", self.lam, 0, why="success rates are divided by their root")
    option_checks.typed_choices(self)
    option_checks.one_of("matching", self.matching, turns.MATCHERS)
    option_checks.flag("trajectory_difficulty", self.trajectory_difficulty)
    option_checks.flag("turn_difficulty", self.turn_difficulty)


def raw_turn_rewards(r: Rollouts, call_reward: jax.Array, answer_turn: str) -> jax.Array:
  """r_{i,j} (Eq. 3): mean matched similarity of the turn's calls (0 without calls).

  With `answer_turn="judge"` the answering step takes `answer_score` instead (spec §4.2).
  """
  chex.assert_rank(call_reward, 3)  # [B, T, K]
  chex.assert_equal_shape([call_reward, r.call_valid])
  raw = turns.turn_mean(call_reward, r.call_valid)
  if answer_turn == "judge":
    raw = jnp.where(turns.answer_steps(r), r.answer_score[:, None], raw)
  return jnp.where(r.step_valid, raw, 0.0)


def difficulty_per_turn(gt_mean: jax.Array, gt_turn: jax.Array, num_turns: int) -> jax.Array:
  """d_{i,j} = 1 − r̄_{i,j}, r̄_{i,j} the mean of r̄(c*) over C*_{i,j}, 0 if empty (Eq. 5-6).

  The paper calls it trajectory-level difficulty: it is per turn, but it weighs the
  *trajectory*-level reward R(τ_i) (option
  `trajectory_difficulty`); the turn-level weighting (option `turn_difficulty`) is
  `turn_weights`, from the success rates."""
  chex.assert_rank([gt_mean, gt_turn], 2)  # [B, C]
  chex.assert_equal_shape([gt_mean, gt_turn])
  chex.assert_type(gt_turn, int)
  mean = segments.segment_mean(gt_mean, *turns.gt_turn_segments(gt_turn, num_turns))
  return 1.0 - mean.reshape(-1, num_turns)


def minmax_rescale(x: jax.Array, ids: jax.Array, mask: jax.Array, num_segments: int):
  """Eq. 8-9 within each segment: r̂ = min-max of x, r̃norm = r̂ · Σ x / Σ r̂.

  A segment whose spread is below `FLAT` gets r̂ = 1[x > 0]; r̃norm = 0 where Σ r̂ = 0.
  Returns (r̃norm, r̂), 0 outside `mask`.
  """
  chex.assert_equal_shape([x, ids, mask])
  chex.assert_type([x, ids, mask], [float, int, bool])
  lo = segments.gather(segments.segment_min(x, ids, mask, num_segments), ids)
  hi = segments.gather(segments.segment_max(x, ids, mask, num_segments), ids)
  flat = hi - lo < FLAT
  r_hat = jnp.where(flat, (x > 0).astype(jnp.float32), (x - lo) / jnp.where(flat, 1.0, hi - lo))
  r_hat = jnp.where(mask, r_hat, 0.0)
  sum_x = segments.gather(segments.segment_sum(x, ids, mask, num_segments), ids)
  sum_hat = segments.gather(segments.segment_sum(r_hat, ids, mask, num_segments), ids)
  norm = r_hat * sum_x / jnp.where(sum_hat > 0, sum_hat, 1.0)
  return jnp.where(mask & (sum_hat > 0), norm, 0.0), r_hat


def success_rate(count: jax.Array, size: jax.Array, lam: float, mode: str) -> jax.Array:
  """s(c*) (Eq. 12): count/(|G| + λ) + λ as printed, or (count + λ)/(|G| + λ) smoothed."""
  if mode == "as_printed":
    return count / (size + lam) + lam
  return (count + lam) / (size + lam)


def turn_success(gt_success: jax.Array, gt_turn: jax.Array, num_turns: int) -> jax.Array:
  """s_{i,j} = min of s(c*) over C*_{i,j}, 1 if empty (Eq. 13)."""
  chex.assert_rank([gt_success, gt_turn], 2)
  chex.assert_equal_shape([gt_success, gt_turn])
  low = segments.segment_min(gt_success, *turns.gt_turn_segments(gt_turn, num_turns), empty=1.0)
  return low.reshape(-1, num_turns)


def turn_weights(raw: jax.Array, s: jax.Array, adv: jax.Array, step_mask: jax.Array):
  """ŵ (Eq. 14-15): w̃ = r/√s on rows with A > 0, else 1; ŵ = w̃ / mean_j w̃ (1 if it is 0)."""
  chex.assert_rank([raw, s, adv, step_mask], [2, 2, 1, 2])  # [B, T] and A per row [B]
  chex.assert_equal_shape([raw, s, step_mask])
  chex.assert_type(step_mask, bool)
  w = jnp.where(adv[:, None] > 0, raw / jnp.sqrt(s), 1.0)
  w = jnp.where(step_mask, w, 0.0)
  mean = jnp.sum(w, axis=1) / jnp.maximum(jnp.sum(step_mask, axis=1), 1)
  w_hat = jnp.where(mean[:, None] > 0, w / jnp.where(mean > 0, mean, 1.0)[:, None], 1.0)
  return jnp.where(step_mask, w_hat, 0.0)


@register("hidifftir", HiDiffTIROptions, spec="4.2", protocol="hidifftir",
          reference="tirjax.testing.reference.matching:hidifftir")
def hidifftir(r: Rollouts, opts: HiDiffTIROptions) -> Advantages:
  """HiDiffTIR turn advantages A_{i,j} = A(τ_i) · (α + (1 − α) ŵ_{i,j}) (Eq. 16).

  A(τ_i) is the group z-score of R(τ_i) = Σ_j r̃norm_{i,j} (Eq. 10-11), r̃ = d · r (Eq. 7)
  min-max normalised and mass-rescaled among the query's rows at each turn index (Eq. 8-9).
  """
  T = r.max_steps
  match = turns.match_calls(r, opts.matching)
  raw = raw_turn_rewards(r, match.call_reward, opts.answer_turn)
  size = turns.group_size(r)[:, None]
  gt_mean = turns.gt_group_sum(r, match.gt_reward) / jnp.maximum(size, 1.0)  # r̄(c*), Eq. 4
  d = difficulty_per_turn(gt_mean, match.gt_turn, T)
  ids, mask, num_segments = turns.turn_segments(r)
  r_tilde = jnp.where(mask, d * raw, 0.0)
  r_norm, r_hat = minmax_rescale(r_tilde, ids, mask, num_segments)
  score = jnp.sum(r_norm if opts.trajectory_difficulty else raw, axis=1)
  adv = segments.zscore(score, r.group_id, r.row_valid, r.num_rows, opts.zscore)

  count = turns.gt_group_sum(r, (match.gt_reward > 0).astype(jnp.float32))
  gt_success = success_rate(count, size, opts.lam, opts.success_rate)
  s = turn_success(gt_success, match.gt_turn, T)
  w_hat = turn_weights(raw, s, adv, mask)
  if opts.turn_difficulty:
    steps = adv[:, None] * (opts.alpha + (1.0 - opts.alpha) * w_hat)
  else:
    steps = jnp.broadcast_to(adv[:, None], raw.shape)
  return broadcast_steps(
      r, steps, adv, score, raw_reward=raw, difficulty=jnp.where(mask, d, 0.0),
      reweighted=r_tilde, minmax=r_hat, normalized=r_norm, turn_success=jnp.where(mask, s, 0.0),
      turn_weight=w_hat, call_reward=match.call_reward, call_match=match.call_gt,
      gt_reward=match.gt_reward, gt_mean_reward=gt_mean,
      gt_success=jnp.where(r.gt_valid, gt_success, 0.0))
