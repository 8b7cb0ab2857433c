"""Per-token estimators of KL(π_θ ‖ π_ref) from samples of π_θ (SPEC §5).

Schulman 2020, "Approximating KL Divergence" (http://joschu.net/blog/kl-approx.html), with
`log r = ref_logp − logp`: k1 = −log r, k2 = ½ (log r)², k3 = (r − 1) − log r. k1 is unbiased
but signed, k2 is biased with low variance, k3 is unbiased and non-negative.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from tirjax.loss.ratio import LOG_RATIO_CLAMP

ESTIMATORS = ("k1", "k2", "k3")


def k1(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """`k1 = logp − ref_logp`."""
  chex.assert_equal_shape([logp, ref_logp])
  return logp - ref_logp


def k2(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """`k2 = ½ (logp − ref_logp)²`."""
  chex.assert_equal_shape([logp, ref_logp])
  return 0.5 * jnp.square(logp - ref_logp)


def k3(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """`k3 = exp(ref_logp − logp) − (ref_logp − logp) − 1`, with the exponent clamped to ±20.

  The clamp (as verl's `low_var_kl`) keeps `exp` finite in float32 for far-apart log-probs.
  """
  chex.assert_equal_shape([logp, ref_logp])
  d = jnp.clip(ref_logp - logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
  return jnp.exp(d) - d - 1.0


def kl_penalty(logp: jax.Array, ref_logp: jax.Array, estimator: str) -> jax.Array:
  """The per-token estimator named `estimator` ∈ {"k1", "k2", "k3"}."""
  if estimator not in ESTIMATORS:
    raise ValueError(f"kl_estimator: must be one of {ESTIMATORS}, got {estimator!r}")
  return {"k1": k1, "k2": k2, "k3": k3}[estimator](logp, ref_logp)
