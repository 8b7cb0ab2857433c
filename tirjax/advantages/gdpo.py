"""GDPO: group reward-decoupled normalisation of several rewards (spec §4.4).

Liu et al. 2026, "GDPO: Group reward-Decoupled Normalization Policy Optimization for
Multi-reward RL Optimization" (arXiv 2601.05242; code: NVlabs/GDPO, for TRL and verl); verl's
`compute_gdpo_outcome_advantage` (`algorithm.adv_estimator=gdpo`). GRPO on a sum of rewards
normalises the sum, so distinct reward combinations with equal sums collapse onto one
advantage; GDPO z-scores each reward within the group first, then sums with weights, then
normalises the sum over the batch:

    A_k = z_g(r_k),   A_sum = Σ_k w_k A_k,   A = (A_sum − mean_batch) / (std_batch + eps).

Checked against verl's function: `experiments/studies/verl_crosscheck.py`,
`tests/test_otb_gdpo_crosscheck.py`.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp

from tirjax import option_checks, segments
from tirjax.advantages.group import broadcast_rows, broadcast_tokens, mean_format_reward
from tirjax.advantages.registry import Advantages, register
from tirjax.advantages.verl_baselines import generated_tokens
from tirjax.rollouts import Rollouts

REWARDS = ("outcome", "format", "answer_score")
BATCH_NORMS = ("rows", "tokens", "none")


@dataclasses.dataclass(frozen=True)
class GDPOOptions:
  """Attributes:
    rewards: the per-row rewards normalised apart: "outcome" (R_out), "format" (the mean of
      the row's step format rewards R_fm, PORTool's formatting reward) and "answer_score"
      (the judge's score of the answer in [0, 1]). The default pair is GDPO's tool-calling
      setting: correctness and format (the rewards `grpo_fm` sums before normalising).
    weights: w_k, one per reward (None: all 1, as GDPO's and verl's default).
    zscore: conventions of each reward's group z-score (spec §3; verl's GRPO gives a group of
      one its raw reward: `singleton="raw"`).
    batch_norm: the last step. "rows" (GDPO's TRL code and the paper): z-score of A_sum over
      the batch's valid rows; "tokens" (verl's, and GDPO's verl code: `masked_whiten`): over
      the batch's generated tokens, so longer rows weigh more; "none": A_sum itself.
    whiten: conventions of the batch step: ddof 1 and eps 1e-4, GDPO's TRL code's (verl:
      (x − mean) · rsqrt(var + 1e-8), ddof 1). The eps also sets when the decoupled sums count
      as all equal (spread ≤ eps · max(1, |A_sum|), `segments.zscore`), which matters here:
      two rewards whose z-scores cancel leave sums of the size of the group step's eps terms
      (~1e-6), which a z-score over the batch blows up: the worked example's cancelling pair
      gets ±0.57 with eps 1e-6 (verl's rsqrt(var + 1e-8): ±0.015), 0 with 1e-4.
  """

  rewards: tuple[str, ...] = ("outcome", "format")
  weights: Optional[tuple[float, ...]] = None
  zscore: segments.ZScore = segments.ZScore()
  batch_norm: str = "rows"
  whiten: segments.ZScore = segments.ZScore(eps=1e-4)

  def __post_init__(self):
    if not isinstance(self.rewards, tuple) or not self.rewards:
      raise ValueError(f"rewards: must be a non-empty tuple of {REWARDS}, got {self.rewards!r}")
    for name in self.rewards:
      option_checks.one_of("rewards", name, REWARDS)
    if len(set(self.rewards)) != len(self.rewards):
      raise ValueError(f"rewards: each reward once, got {self.rewards}")
    if self.weights is not None:
      if not isinstance(self.weights, tuple) or len(self.weights) != len(self.rewards):
        raise ValueError(f"weights: a tuple of one weight per reward ({len(self.rewards)}), "
                         f"got {self.weights!r}")
      for w in self.weights:
        if not option_checks.is_finite_number(w):
          raise ValueError(f"weights: must be finite numbers, got {self.weights!r}")
    for name in ("zscore", "whiten"):
      if not isinstance(getattr(self, name), segments.ZScore):
        raise ValueError(f"{name}: must be a segments.ZScore, got "
                         f"{type(getattr(self, name)).__name__}")
    option_checks.one_of("batch_norm", self.batch_norm, BATCH_NORMS)


def row_reward(r: Rollouts, name: str) -> jax.Array:
  """[B] one of `REWARDS` per row."""
  if name == "outcome":
    return r.outcome
  if name == "format":
    return mean_format_reward(r)
  return r.answer_score


@register("gdpo", GDPOOptions, spec="4.4",
          reference="tirjax.testing.reference.otb_gdpo:gdpo")
def gdpo(r: Rollouts, opts: GDPOOptions) -> Advantages:
  """GDPO: whiten_batch(Σ_k w_k · z_g(r_k)), each reward z-scored within the query's group.

  Liu et al. 2026 (arXiv 2601.05242), §3 (decoupled group normalisation, then batch-wise
  normalisation); verl's `gdpo`. Decisions: the rewards are tirjax's per-row ones (R_out,
  mean R_fm, the answer score; see `GDPOOptions`); spec §3 holds in the group step (a group
  of one gets 0, verl's GRPO its raw reward; all-equal rewards give 0 for that reward); the
  batch step over rows, as the paper's code (verl whitens over tokens: `batch_norm="tokens"`),
  shifts rows of all-equal groups by −mean/std as whitening does (so they are not exactly 0
  unless every row of the batch is); sums equal up to the batch step's eps (1e-4) give 0,
  not a sign made of the group step's eps terms (`GDPOOptions.whiten`). Worked example: one group of two rows, (R_out, R_fm) =
  (+1, −0.25) and (−1, +0.25): each reward z-scores to (+0.707, −0.707) and (−0.707, +0.707),
  so A_sum = 0 for both (the rewards cancel; GRPO on the sum, 0.75 against −0.75, gives
  ±0.707); with weights (1, 0.5), A_sum = ±0.354, whitened over the two rows to ±0.707.
  """
  ids, valid, B = r.group_id, r.row_valid, r.num_rows
  weights = opts.weights if opts.weights is not None else (1.0,) * len(opts.rewards)
  parts = {}
  total = jnp.zeros(B, jnp.float32)
  for name, w in zip(opts.rewards, weights):
    z = segments.zscore(row_reward(r, name), ids, valid, B, opts.zscore)
    parts[name] = z
    total = total + jnp.float32(w) * z
  total = jnp.where(valid, total, 0.0)
  reward = jnp.where(valid, sum(jnp.float32(w) * row_reward(r, n)
                                for n, w in zip(opts.rewards, weights)), 0.0)
  if opts.batch_norm == "tokens":
    live = generated_tokens(r)
    tokens = segments.whiten(jnp.where(live, total[:, None], 0.0), live, opts.whiten)
    return broadcast_tokens(r, tokens, reward, decoupled=total, **_named(parts))
  adv = segments.whiten(total, valid, opts.whiten) if opts.batch_norm == "rows" else total
  return broadcast_rows(r, adv, reward, decoupled=total, **_named(parts))


def _named(parts: dict) -> dict:
  return {f"z_{name}": z for name, z in parts.items()}
