"""The clipped policy-gradient surrogate, CISPO's clipped-weight REINFORCE term, and the clip
indicators (spec §4.4, §5).

Per-token losses (to be minimised); `ratio` is ρ (token or GSPO), `adv` the token advantage A.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def clipped_surrogate(ratio: jax.Array, adv: jax.Array, clip_low: float,
                      clip_high: float) -> jax.Array:
  """`pg = −min(ρ·A, clip(ρ, 1 − ε_low, 1 + ε_high)·A)`.

  Schulman et al. 2017 (PPO), Eq. 7; separate lower and upper bounds ("clip-higher") from
  Yu et al. 2025 (DAPO), Eq. 10. The clipped branch is active, with zero gradient in ρ,
  for A > 0 and ρ > 1 + ε_high, and for A < 0 and ρ < 1 − ε_low.
  """
  chex.assert_equal_shape([ratio, adv])
  return -jnp.minimum(ratio * adv, jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv)


def cispo_surrogate(ratio: jax.Array, adv: jax.Array, logp: jax.Array, clip_low: float,
                    clip_high: float) -> jax.Array:
  """`pg = −sg(clip(ρ, 1 − ε_low, 1 + ε_high)) · A · log π_θ` (CISPO).

  MiniMax 2025, "MiniMax-M1", §3.1 (CISPO): the importance weight is clipped and
  stop-gradiented, and multiplies the REINFORCE term A · log π, so every token keeps its
  gradient `−clip(ρ) · A · ∇log π` (the clipped surrogate drops the tokens whose ratio left
  the clip range in A's favoured direction). With ρ = 1 (one update per rollout batch) its
  gradient is the clipped surrogate's. The value is not the surrogate's (it scales with
  log π); only its gradient is meant. ε_low ≥ 1 leaves the weight without a lower bound, as
  MiniMax-M1 does (verl's example: ε_low = 10). Same as verl's `compute_policy_loss_cispo`.
  """
  chex.assert_equal_shape([ratio, adv, logp])
  weight = jax.lax.stop_gradient(jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high))
  return -weight * adv * logp


def dual_clip(pg: jax.Array, adv: jax.Array, c: float) -> jax.Array:
  """For A < 0: `pg ← min(pg, −c·A)`; unchanged for A ≥ 0.

  Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep RL", Eq. 5: the
  objective `max(min(ρA, clip(ρ)A), c·A)` for A < 0, negated. It caps the loss of a negative
  advantage at `c·|A|`, so a token with ρ > c (c > 1) passes no gradient instead of an
  unbounded one. Same as verl's `clip_ratio_c` (`torch.min(-A·c, max(-Aρ, -A·clip(ρ)))`).
  """
  chex.assert_equal_shape([pg, adv])
  return jnp.where(adv < 0, jnp.minimum(pg, -c * adv), pg)


def clipped_low(ratio: jax.Array, adv: jax.Array, clip_low: float) -> jax.Array:
  """Tokens whose loss the lower bound clips: `A < 0 and ρ < 1 − ε_low` (bool)."""
  return (adv < 0) & (ratio < 1.0 - clip_low)


def clipped_high(ratio: jax.Array, adv: jax.Array, clip_high: float) -> jax.Array:
  """Tokens whose loss the upper bound clips: `A > 0 and ρ > 1 + ε_high` (bool)."""
  return (adv > 0) & (ratio > 1.0 + clip_high)


def clipped_dual(ratio: jax.Array, adv: jax.Array, c: float) -> jax.Array:
  """Tokens whose loss the dual clip caps: `A < 0 and ρ > c` (bool; requires c > 1)."""
  return (adv < 0) & (ratio > c)
