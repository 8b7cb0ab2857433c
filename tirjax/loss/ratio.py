"""Importance ratios between the current and the behaviour policy (spec §5).

All log-ratios are clamped to ±20 before `exp`, as verl does (`core_algos.compute_policy_loss`),
so that a stale or mismatched log-prob cannot overflow float32; outside the clamp the ratio is
constant and passes no gradient.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

LOG_RATIO_CLAMP = 20.0


def clamped_log_ratio(logp: jax.Array, old_logp: jax.Array) -> jax.Array:
  """`clamp(logp − old_logp, −20, 20)`."""
  chex.assert_equal_shape([logp, old_logp])
  return jnp.clip(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def token_ratio(logp: jax.Array, old_logp: jax.Array) -> jax.Array:
  """Per-token ratio `ρ_t = exp(clamp(logp_t − old_logp_t, ±20))` = π_θ(y_t) / π_old(y_t).

  Schulman et al. 2017, "Proximal Policy Optimization Algorithms", Eq. 6.
  """
  return jnp.exp(clamped_log_ratio(logp, old_logp))


def sequence_log_ratio(logp: jax.Array, old_logp: jax.Array, mask: jax.Array) -> jax.Array:
  """`log s_i = (1/|y_i|) Σ_{t ∈ y_i} (logp_t − old_logp_t)`, per row [B] (0 for an empty row).

  The length-normalised sequence log-ratio of GSPO: Zheng et al. 2025, "Group Sequence
  Policy Optimization", Eq. 7, `s_i = (π_θ(y_i|x) / π_old(y_i|x))^(1/|y_i|)`.

  Args:
    logp, old_logp: [B, L] log-probs of the sampled tokens.
    mask: [B, L] bool, the row's generated tokens (`y_i`).
  """
  chex.assert_equal_shape([logp, old_logp, mask])
  diff = jnp.where(mask, logp - old_logp, 0.0)
  n = jnp.sum(mask, axis=1, dtype=jnp.float32)
  return jnp.sum(diff, axis=1) / jnp.maximum(n, 1.0)


def gspo_token_ratio(logp: jax.Array, old_logp: jax.Array, mask: jax.Array) -> jax.Array:
  """GSPO-token ratio `s_{i,t} = sg[s_i] · π_θ(y_t) / sg[π_θ(y_t)]`, [B, L].

  Zheng et al. 2025, Eq. 13-14. Its value is the sequence ratio `s_i` on every token of row i,
  and `∇ s_{i,t} = s_i ∇ logp_t`: with token advantages equal to the row's advantage and the
  `seq_mean_token_mean` aggregation, GSPO-token equals sequence-level GSPO in value and
  gradient. The exponent is clamped to ±20 like the token ratio.
  """
  log_s = jax.lax.stop_gradient(sequence_log_ratio(logp, old_logp, mask))
  log_ratio = log_s[:, None] + logp - jax.lax.stop_gradient(logp)
  return jnp.exp(jnp.clip(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
