"""What a train step reads, and its split into micro-batches of rows.

A step reads only the arrays its loss needs (not the whole `Rollouts`), so the compiled step
does not depend on fields such as `calls` being present. Every leaf has the rows as its
leading axis, which the step shards over the batch mesh axes.
"""

from __future__ import annotations

from typing import Any, Optional

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from tirjax.advantages.registry import Advantages
from tirjax.rollouts import Rollouts


@flax.struct.dataclass(frozen=True)
class PolicyBatch:
  """Inputs of the policy loss (spec §5), `[B, L]` unless noted."""

  tokens: jax.Array  # int32
  token_valid: jax.Array  # bool
  loss_mask: jax.Array  # bool, generated tokens
  old_logprobs: jax.Array  # f32, the sampler's
  advantages: jax.Array  # f32, `Advantages.tokens`
  row_mask: jax.Array  # [B] bool, `Advantages.row_mask`
  ref_logprobs: Optional[jax.Array] = None  # f32, required when the KL weight β > 0
  # f32, the sampler's own log-probs when `old_logprobs` are the trainer's recomputed π_old:
  # required by a rollout correction (`LossOptions.rollout_correction`, TIS / MIS)
  sampler_logprobs: Optional[jax.Array] = None


TOKEN_FIELDS = ("tokens", "token_valid", "loss_mask", "token_step", "old_logprobs",
                "ref_logprobs")


def longest_row(rollouts: Rollouts) -> int:
  """Tokens in the batch's longest row (at least 1)."""
  valid = np.asarray(rollouts.token_valid)
  return int(valid.any(axis=0).nonzero()[0].max()) + 1 if valid.any() else 1


def trim_tokens(rollouts: Rollouts, multiple: int = 128, longest: Optional[int] = None
                ) -> Rollouts:
  """`rollouts` with its `[B, L]` token fields cut after the longest row, rounded up to a
  multiple of `multiple` (a few shapes, so a few compilations). Rows are right-padded, so
  nothing valid is cut; the train step's cost grows with L (attention with L²), and a
  batch's rows are often far shorter than the context bound L. `longest`: cut after that many
  tokens instead (the longest row of every process's share, so that the shares agree)."""
  longest = longest_row(rollouts) if longest is None else longest
  if longest < longest_row(rollouts):
    raise ValueError(f"trim_tokens: longest={longest} would cut a row of "
                     f"{longest_row(rollouts)} tokens")
  length = min(rollouts.max_tokens, -(-longest // multiple) * multiple)
  if length == rollouts.max_tokens:
    return rollouts
  return rollouts.replace(**{f: getattr(rollouts, f)[:, :length] for f in TOKEN_FIELDS
                             if getattr(rollouts, f) is not None})


def policy_batch(rollouts: Rollouts, advantages: Advantages,
                 sampler_logprobs: Optional[jax.Array] = None) -> PolicyBatch:
  """The policy step's batch from a rollout batch and its estimator output (and, for a
  rollout correction, the sampler's log-probs of the same tokens)."""
  return PolicyBatch(tokens=rollouts.tokens, token_valid=rollouts.token_valid,
                     loss_mask=rollouts.loss_mask, old_logprobs=rollouts.old_logprobs,
                     advantages=advantages.tokens, row_mask=advantages.row_mask,
                     ref_logprobs=rollouts.ref_logprobs, sampler_logprobs=sampler_logprobs)


@flax.struct.dataclass(frozen=True)
class SFTBatch:
  """Demonstrations for supervised fine-tuning, `[B, L]`: the loss is the negative
  log-likelihood of the tokens where `loss_mask` is set (e.g. the assistant's tokens)."""

  tokens: jax.Array  # int32
  token_valid: jax.Array  # bool, real tokens (right padding)
  loss_mask: jax.Array  # bool, target tokens


def split_microbatches(batch: Any, num: int) -> Any:
  """`[B, ...]` → `[num, B/num, ...]`; micro-batch m holds rows m, m + num, m + 2·num, ...

  Strided, so that with the rows sharded in contiguous blocks over the devices (B/num a
  multiple of the batch shards) every micro-batch has the same rows on every device and the
  split moves no data.
  """
  def split(x):
    rows = x.shape[0]
    if rows % num:
      raise ValueError(f"num_microbatches: {num} does not divide the batch of {rows} rows")
    return jnp.swapaxes(x.reshape((rows // num, num) + x.shape[1:]), 0, 1)

  return jax.tree.map(split, batch)


def merge_microbatches(batch: Any) -> Any:
  """The inverse of `split_microbatches`: `[num, B/num, ...]` → `[B, ...]`."""
  def merge(x):
    num, per = x.shape[:2]
    return jnp.swapaxes(x, 0, 1).reshape((num * per,) + x.shape[2:])

  return jax.tree.map(merge, batch)
