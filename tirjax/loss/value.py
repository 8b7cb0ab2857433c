"""The critic's clipped value loss, as `(sum, denominator)` like the policy loss (spec §5).

    out = value_loss(vpreds, old_values, returns, mask, cliprange_value=0.5,
                     aggregation="token_mean")
    out.loss.sum / out.loss.den     # accumulate over micro-batches, divide once

Per token (PPO's value clipping, Schulman et al. 2017's baselines code; verl's
`compute_value_loss`, itself TRL's):

    v_clip = clip(v, V_old − c, V_old + c)
    ℓ      = ½ · max((v − G)², (v_clip − G)²)

with v the critic's new prediction, V_old the value the advantages were computed with, G the
estimator's return (`Advantages.extras["returns"]`) and c = `cliprange_value` (None: no
clipping, ℓ = ½ (v − G)²). `mask` is the tokens whose values the critic fits
(`extras["value_mask"]`: the loss tokens for `ppo`, each turn's first loss token for
`turn_ppo`), and the aggregation one of `tirjax.loss.aggregation`'s modes, so micro-batches
and devices combine exactly. verl applies the ½ after its aggregation; the same, it is linear.
One difference in the aggregation, declared: verl's "seq-mean-token-sum-norm" divides the
summed loss by the constant only, tirjax's by the constant and the rows R (its
`aggregation` module's definition, shared with the policy loss).
"""

from __future__ import annotations

from typing import Optional

import chex
import flax.struct
import jax
import jax.numpy as jnp

from tirjax.loss.aggregation import aggregate
from tirjax.loss.stats import Mean


@flax.struct.dataclass(frozen=True)
class ValueLossOutput:
  loss: Mean  # the aggregated ½ · max(...) (sum, den)
  clipfrac: Mean  # share of masked tokens where the clipped error is the larger
  error: Mean  # mean (v − G)² over the masked tokens (the unclipped error, for logging)


def clipped_value_losses(vpreds: jax.Array, old_values: jax.Array, returns: jax.Array,
                         cliprange_value: Optional[float]) -> tuple[jax.Array, jax.Array]:
  """(ℓ [B, L], clipped [B, L] bool): ½ · max((v − G)², (clip(v, V_old ± c) − G)²) per token
  and where the clipped term is strictly the larger."""
  chex.assert_equal_shape([vpreds, old_values, returns])
  unclipped = jnp.square(vpreds - returns)
  if cliprange_value is None:
    return 0.5 * unclipped, jnp.zeros(unclipped.shape, bool)
  v_clip = jnp.clip(vpreds, old_values - cliprange_value, old_values + cliprange_value)
  clipped = jnp.square(v_clip - returns)
  return 0.5 * jnp.maximum(unclipped, clipped), clipped > unclipped


def value_loss(vpreds: jax.Array, old_values: jax.Array, returns: jax.Array, mask: jax.Array,
               cliprange_value: Optional[float] = None, aggregation: str = "token_mean",
               norm_constant: Optional[float] = None) -> ValueLossOutput:
  """The clipped value loss of the module docstring, aggregated over `mask` [B, L]."""
  chex.assert_equal_shape([vpreds, mask])
  chex.assert_type(mask, bool)
  if cliprange_value is not None and not cliprange_value > 0:
    raise ValueError(f"cliprange_value: must be > 0 or None, got {cliprange_value!r}")
  losses, clipped = clipped_value_losses(vpreds.astype(jnp.float32),
                                         old_values.astype(jnp.float32),
                                         returns.astype(jnp.float32), cliprange_value)
  count = jnp.sum(mask, dtype=jnp.float32)
  return ValueLossOutput(
      loss=aggregate(losses, mask, aggregation, norm_constant),
      clipfrac=Mean(jnp.sum(mask & clipped, dtype=jnp.float32), count),
      error=Mean(jnp.sum(jnp.where(mask, jnp.square(vpreds - returns), 0.0),
                         dtype=jnp.float32), count))
