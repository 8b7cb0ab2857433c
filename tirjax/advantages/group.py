"""Outcome-level group baselines: grpo, grpo_fm, dr_grpo, rloo, dapo, arpo (spec §4.3).

Each gives one advantage per row, broadcast to every step and generated token of the row.
"""

from __future__ import annotations

import dataclasses

import chex
import jax.numpy as jnp

from tirjax import segments
from tirjax.advantages.registry import Advantages, register
from tirjax.rollouts import Rollouts, step_to_tokens


@dataclasses.dataclass(frozen=True)
class GroupOptions:
  zscore: segments.ZScore = segments.ZScore()


def broadcast_rows(r: Rollouts, row_adv, row_reward, row_mask=None, **extras) -> Advantages:
  """Row advantages → steps → tokens; everything 0 on padding and on masked-out rows."""
  chex.assert_shape([row_adv, row_reward], r.row_valid.shape)  # [B]
  row_mask = r.row_valid if row_mask is None else row_mask & r.row_valid
  row_adv = jnp.where(row_mask, row_adv, 0.0)
  steps = jnp.where(r.step_valid, row_adv[:, None], 0.0)
  return broadcast_steps(r, steps, row_adv, row_reward, row_mask, **extras)


def broadcast_steps(r: Rollouts, steps, row_adv, row_reward, row_mask=None, **extras):
  """Step advantages [B, T] → tokens [B, L] through `token_step`."""
  chex.assert_equal_shape([steps, r.step_valid])
  chex.assert_shape([row_adv, row_reward], r.row_valid.shape)
  row_mask = r.row_valid if row_mask is None else row_mask & r.row_valid
  steps = jnp.where(r.step_valid & row_mask[:, None], steps, 0.0).astype(jnp.float32)
  tokens = jnp.where(r.loss_mask, step_to_tokens(steps, r.token_step), 0.0)
  return Advantages(tokens=tokens, steps=steps, rows=jnp.asarray(row_adv, jnp.float32),
                    row_reward=jnp.asarray(row_reward, jnp.float32), row_mask=row_mask,
                    extras=extras)


def broadcast_tokens(r: Rollouts, tokens, row_reward, row_mask=None, **extras) -> Advantages:
  """Token advantages [B, L] of a token-level estimator (REINFORCE++'s discounted returns):
  each step gets the mean of its tokens' advantages and each row the mean of its own (the
  step and row values that logging and the unlearning diagnostic read); 0 on padding."""
  chex.assert_equal_shape([tokens, r.loss_mask])
  chex.assert_shape(row_reward, r.row_valid.shape)
  row_mask = r.row_valid if row_mask is None else row_mask & r.row_valid
  live = r.loss_mask & row_mask[:, None]
  tokens = jnp.where(live, tokens, 0.0).astype(jnp.float32)
  B, T = r.num_rows, r.max_steps
  ids = jnp.arange(B)[:, None] * T + jnp.clip(r.token_step, 0, T - 1)
  steps = segments.segment_mean(tokens, ids, live, B * T).reshape(B, T)
  rows = jnp.sum(tokens, axis=1) / jnp.maximum(jnp.sum(live, axis=1), 1)
  return Advantages(tokens=tokens, steps=jnp.where(r.step_valid, steps, 0.0), rows=rows,
                    row_reward=jnp.asarray(row_reward, jnp.float32), row_mask=row_mask,
                    extras=extras)


def group_zscore(r: Rollouts, x, opts: segments.ZScore):
  """z-score of the row values x [B] within each query's group (spec §3)."""
  chex.assert_shape(x, r.row_valid.shape)
  return segments.zscore(x, r.group_id, r.row_valid, r.num_rows, opts)


@register("grpo", GroupOptions, spec="4.3", group_normalised=True,
          reference="tirjax.testing.reference.group:grpo")
def grpo(r: Rollouts, opts: GroupOptions) -> Advantages:
  """GRPO: A_j = (R_out_j − mean_g R_out) / (std_g R_out + eps).

  Shao et al. 2024, DeepSeekMath, §4.1.2 (outcome supervision).
  """
  return broadcast_rows(r, group_zscore(r, r.outcome, opts.zscore), r.outcome)


def mean_format_reward(r: Rollouts):
  """mean_t R_fm over the row's valid steps (0 for a row without steps)."""
  n = jnp.maximum(jnp.sum(r.step_valid, axis=1), 1)
  return jnp.sum(jnp.where(r.step_valid, r.format_reward, 0.0), axis=1) / n


@register("arpo", GroupOptions, spec="4.3", group_normalised=True, rollout=dict(mode="arpo"),
          reference="tirjax.testing.reference.group:grpo")
def arpo(r: Rollouts, opts: GroupOptions) -> Advantages:
  """ARPO: GRPO advantages over entropy-adaptive rollouts.

  Dong et al. 2025, "Agentic Reinforced Policy Optimization": the method is on the rollout
  side (branching after tool responses when entropy rises, `tirjax.episodes` mode "arpo");
  its advantage is GRPO's.
  """
  return grpo(r, opts)


@register("grpo_fm", GroupOptions, spec="4.3", group_normalised=True,
          reference="tirjax.testing.reference.group:grpo_fm")
def grpo_fm(r: Rollouts, opts: GroupOptions) -> Advantages:
  """GRPO_fm: z-score of R_out + mean_t R_fm (PORTool §4, formatting-augmented GRPO).

  The formatting reward augments the trajectory-level reward before normalisation.
  """
  reward = r.outcome + mean_format_reward(r)
  return broadcast_rows(r, group_zscore(r, reward, opts.zscore), reward)


@dataclasses.dataclass(frozen=True)
class DrGRPOOptions:
  zscore: segments.ZScore = segments.ZScore(scale="none")


@register("dr_grpo", DrGRPOOptions, spec="4.3", group_normalised=True,
          loss=dict(aggregation="seq_mean_token_sum_norm"),
          reference="tirjax.testing.reference.group:dr_grpo")
def dr_grpo(r: Rollouts, opts: DrGRPOOptions) -> Advantages:
  """Dr. GRPO: A_j = R_out_j − mean_g R_out (no std scaling).

  Liu et al. 2025, "Understanding R1-Zero-Like Training", Eq. 3; pair it with the
  `seq_mean_token_sum_norm` loss aggregation.
  """
  return broadcast_rows(r, group_zscore(r, r.outcome, opts.zscore), r.outcome)


@dataclasses.dataclass(frozen=True)
class RLOOOptions:
  singleton: str = "zero"  # a group of one: 0 (spec §3) or its raw R_out ("raw")

  def __post_init__(self):
    segments.ZScore(singleton=self.singleton)  # validates the value


@register("rloo", RLOOOptions, spec="4.3", group_normalised=True,
          reference="tirjax.testing.reference.group:rloo")
def rloo(r: Rollouts, opts: RLOOOptions) -> Advantages:
  """RLOO: A_j = R_j − mean_{k≠j} R_k = n/(n−1) · (R_j − mean_g R).

  Ahmadian et al. 2024, "Back to Basics", §3.2 (leave-one-out baseline). A singleton group
  has no other rows: advantage 0 (or R_j with `singleton="raw"`).
  """
  ids, valid, B = r.group_id, r.row_valid, r.num_rows
  n = segments.gather(segments.segment_count(ids, valid, B), ids)
  dev = r.outcome - segments.gather(segments.segment_mean(r.outcome, ids, valid, B), ids)
  adv = dev * n / jnp.maximum(n - 1.0, 1.0)
  adv = jnp.where(n <= 1, r.outcome if opts.singleton == "raw" else 0.0, adv)
  return broadcast_rows(r, adv, r.outcome)


@dataclasses.dataclass(frozen=True)
class DAPOOptions:
  zscore: segments.ZScore = segments.ZScore()
  dynamic_sampling: bool = True  # mask groups whose rows are all correct or none is
  overlong_shaping: bool = True  # penalise responses past L_max - L_cache (DAPO's Eq. 13)
  max_response_tokens: int = 20480  # L_max
  overlong_cache: int = 4096  # L_cache

  def __post_init__(self):
    if not 0 <= self.overlong_cache <= self.max_response_tokens:
      raise ValueError("overlong_cache: must lie in [0, max_response_tokens], got "
                       f"{self.overlong_cache} (max_response_tokens={self.max_response_tokens})")


def overlong_penalty(length, max_len: int, cache: int):
  """DAPO's soft overlong punishment (Yu et al. 2025, Eq. 13).

  0 if |y| ≤ L_max − L_cache; ((L_max − L_cache) − |y|) / L_cache inside the cache window;
  −1 beyond L_max.
  """
  chex.assert_rank(length, 1)  # tokens per row [B]
  start = max_len - cache
  inside = (start - length) / max(cache, 1)
  return jnp.where(length <= start, 0.0, jnp.where(length <= max_len, inside, -1.0))


@register("dapo", DAPOOptions, spec="4.3", group_normalised=True,
          loss=dict(clip_low=0.2, clip_high=0.28, aggregation="token_mean"),
          reference="tirjax.testing.reference.group:dapo")
def dapo(r: Rollouts, opts: DAPOOptions) -> Advantages:
  """DAPO: GRPO advantages of the shaped reward; dynamic sampling masks the groups that are
  all correct or have no correct row.

  Yu et al. 2025, "DAPO", §3.2 (dynamic sampling: Eq. 11 keeps a group when
  `0 < |{o_i correct}| < G`) and §3.4 (overlong reward shaping). The filter reads the outcomes
  (correct: R_out = +1), never the shaped reward, so the overlong penalty cannot keep a group
  whose answers are all right or all wrong (spec §4.3). The trainer refills the batch; the
  clip-higher loss (ε_low 0.2, ε_high 0.28, token-mean) is the loss side.
  """
  reward = r.outcome
  if opts.overlong_shaping:
    length = jnp.sum(r.loss_mask, axis=1).astype(jnp.float32)
    reward = reward + overlong_penalty(length, opts.max_response_tokens, opts.overlong_cache)
  ids, valid, B = r.group_id, r.row_valid, r.num_rows
  keep = valid
  if opts.dynamic_sampling:
    correct = segments.segment_sum((r.outcome > 0).astype(jnp.float32), ids, valid, B)
    size = segments.segment_count(ids, valid, B)
    keep = valid & segments.gather((correct > 0) & (correct < size), ids)
  adv = group_zscore(r, reward, opts.zscore)
  return broadcast_rows(r, adv, reward, keep)
