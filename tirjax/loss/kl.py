"""Per-token estimators of KL(π_θ ‖ π_ref) from samples of π_θ (spec §5).

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
K3_CLAMP = 10.0  # verl low_var_kl: the value is clamped to [-10, 10]


def k1(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """`k1 = logp − ref_logp`."""
  chex.assert_equal_shape([logp, ref_logp])
  return logp - ref_logp


def k2(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """`k2 = ½ (logp − ref_logp)²`."""
  chex.assert_equal_shape([logp, ref_logp])
  return 0.5 * jnp.square(logp - ref_logp)


def k3(logp: jax.Array, ref_logp: jax.Array, clamp: float = K3_CLAMP) -> jax.Array:
  """`k3 = clip(exp(d) − d − 1, −clamp, clamp)` with `d = clip(ref_logp − logp, ±20)`.

  As verl's `low_var_kl` (`kl_penalty` in verl/trainer/ppo/core_algos.py): the exponent's clamp
  keeps `exp` finite in float32, and the value's clamp (spec §5 `kl_clamp`, default 10) keeps a
  reference far from the policy from blowing up the loss: beyond it the value is constant and
  its gradient 0. `clamp = 0` turns the value's clamp off.
  """
  chex.assert_equal_shape([logp, ref_logp])
  d = jnp.clip(ref_logp - logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
  value = jnp.exp(d) - d - 1.0
  return jnp.clip(value, -clamp, clamp) if clamp > 0 else value


def kl_penalty(logp: jax.Array, ref_logp: jax.Array, estimator: str,
               clamp: float = K3_CLAMP) -> jax.Array:
  """The per-token estimator named `estimator` ∈ {"k1", "k2", "k3"}; `clamp` bounds k3's value
  (verl clamps only `low_var_kl`, so k1 and k2 are left as they are)."""
  if estimator not in ESTIMATORS:
    raise ValueError(f"kl_estimator: must be one of {ESTIMATORS}, got {estimator!r}")
  if estimator == "k3":
    return k3(logp, ref_logp, clamp)
  return {"k1": k1, "k2": k2}[estimator](logp, ref_logp)
