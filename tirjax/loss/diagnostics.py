"""Per-step diagnostics of the policy loss, as accumulable statistics over loss tokens.

Every fraction and mean is a `Mean(sum, den)` whose denominator is the number of loss tokens;
spreads are `Summary`s. All are taken over `mask` (generated tokens of rows in the loss).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from tirjax.loss import surrogate
from tirjax.loss.stats import Stat, masked_mean, summarize


def approx_kl_k1(log_ratio: jax.Array) -> jax.Array:
  """k1 estimate of KL(π_old ‖ π_θ) from samples of π_old: `−log ρ` (verl's `ppo_kl`)."""
  return -log_ratio


def approx_kl_k3(log_ratio: jax.Array) -> jax.Array:
  """k3 estimate of KL(π_old ‖ π_θ): `(ρ − 1) − log ρ` ≥ 0 (Schulman 2020)."""
  return jnp.expm1(log_ratio) - log_ratio


def loss_diagnostics(ratio: jax.Array, log_ratio: jax.Array, adv: jax.Array, mask: jax.Array,
                     clip_low: float, clip_high: float, dual_clip: Optional[float],
                     entropy: Optional[jax.Array] = None) -> dict[str, Stat]:
  """What a researcher reads every step.

  Args:
    ratio: [B, L] the ratio the surrogate used (token ratio, or GSPO's sequence ratio,
      which then counts once per token of its row).
    log_ratio: [B, L] the clamped per-token `logp − old_logp` (for the old-vs-new KL).
    adv: [B, L] token advantages.
    mask: [B, L] bool loss tokens.
    clip_low, clip_high, dual_clip: the clip settings of the loss.
    entropy: optional [B, L] per-token entropy of the current policy.

  Returns:
    `clip_frac_low`, `clip_frac_high` (and `clip_frac_dual` when the dual clip is on): the
    fraction of tokens whose loss each bound clips; `approx_kl_k1`, `approx_kl_k3`: old-vs-new
    KL; `zero_adv_frac`: fraction of tokens with A = 0 exactly; `ratio`, `advantage` (and
    `entropy`): `Summary` (mean, std, min, max).
  """
  out: dict[str, Stat] = {
      "clip_frac_low": masked_mean(surrogate.clipped_low(ratio, adv, clip_low), mask),
      "clip_frac_high": masked_mean(surrogate.clipped_high(ratio, adv, clip_high), mask),
  }
  if dual_clip is not None:
    out["clip_frac_dual"] = masked_mean(surrogate.clipped_dual(ratio, adv, dual_clip), mask)
  out.update({
      "approx_kl_k1": masked_mean(approx_kl_k1(log_ratio), mask),
      "approx_kl_k3": masked_mean(approx_kl_k3(log_ratio), mask),
      "zero_adv_frac": masked_mean(adv == 0, mask),
      "ratio": summarize(ratio, mask),
      "advantage": summarize(adv, mask),
  })
  if entropy is not None:
    out["entropy"] = summarize(entropy, mask)
  return out
