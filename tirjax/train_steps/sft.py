"""Supervised fine-tuning loss: masked next-token cross-entropy on demonstrations.

For target tokens `mask[b, i]` (position i ≥ 1, a real token following a real token):

    nll = aggregate(−log p(tokens[b, i] | tokens[b, :i]), mask)     (a `Mean(sum, den)`)

with the aggregation modes of the policy loss (`tirjax.loss.aggregation`; "token_mean" is the
usual SFT loss: every target token weighs the same), so micro-batches accumulate exactly.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import chex
import jax
import jax.numpy as jnp

from tirjax.loss import aggregation as aggregation_modes
from tirjax.loss.stats import Mean


@dataclasses.dataclass(frozen=True)
class SFTLossOptions:
  """Options of the SFT loss.

  Attributes:
    aggregation: a mode of `tirjax.loss.aggregation.MODES` ("token_mean": every target token
      weighs the same; "seq_mean_token_mean": every demonstration weighs the same).
    norm_constant: the divisor of a mode that needs one ("seq_mean_token_sum_norm"; required
      by it, unused by the others).
  """

  aggregation: str = "token_mean"
  norm_constant: Optional[float] = None

  def __post_init__(self):
    aggregation_modes.check_options(self.aggregation, self.norm_constant)


def target_mask(token_valid: jax.Array, loss_mask: jax.Array) -> jax.Array:
  """Positions whose token is predicted from a real prefix: `loss_mask ∧ valid[i] ∧
  valid[i−1]`, never position 0 (nothing predicts the first token)."""
  chex.assert_equal_shape([token_valid, loss_mask])
  valid = jnp.asarray(token_valid, bool)
  pair = jnp.pad(valid[:, 1:] & valid[:, :-1], ((0, 0), (1, 0)))
  return jnp.asarray(loss_mask, bool) & pair


def sft_loss(logprobs: jax.Array, mask: jax.Array, opts: SFTLossOptions = SFTLossOptions()) -> Mean:
  """Negative log-likelihood of the masked tokens as `Mean(sum, den)`.

  Args:
    logprobs: [B, L] log p(token_i | tokens_<i) (as `token_logprobs` returns them).
    mask: [B, L] bool target positions (`target_mask`). Values outside it are ignored.
  """
  chex.assert_equal_shape([logprobs, mask])
  nll = -jnp.where(mask, jnp.asarray(logprobs, jnp.float32), 0.0)
  return aggregation_modes.aggregate(nll, mask, opts.aggregation, opts.norm_constant)
