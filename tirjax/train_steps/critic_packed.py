"""The critic's passes on packed forests: its values, and its update (issue 53).

    step = PackedValueStep(graphdef, tx, place, loss_fn_args..., opts)
    select = step.prepare(critic_batch, group_id)      # host: each group one forest
    state, metrics = step(state, select(rows))          # rows of a mini-batch

The padded critic forwards every `[B, L]` row whole: a group's prompt once per row, a tree's
shared steps once per leaf below them. Here, as in the policy's packed step
(`tirjax.train_steps.packed`, whose `Packer` and layout these reuse), each query group's rows
become one forest, so every shared prefix runs through the trunk once, and the forests are
packed into micro-batches by `max_tokens_per_microbatch`.

The value of token i is the head on the hidden state of the token before it on its path
(`prev`), as `ValueModel.values` reads position l − 1 of its row; the tree attention gives that
token the padded row's keys at the padded row's positions, so the values are the padded ones.
They are gathered back into the row layout `[S, R, L]` and the clipped value loss
(`tirjax.loss.value`) runs on those rows with the value mask, returns and old values gathered
into the same slots. So the loss is the padded one term by term: an empty slot has no masked
token, and every aggregation's denominator counts only rows with masked tokens (spec §5), so
the (sum, den) accumulation over micro-batches gives the padded gradient

    g = Σ_m ∇ sum_m / max(Σ_m den_m, 1).

A token shared by several rows has one hidden state; the gather's autodiff sums the rows'
gradients into it. Only rows with value-mask tokens are packed, up to their last one (nothing
after it moves the loss), and only those tokens' values are read.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from tirjax.loss.value import value_loss
from tirjax.train_steps import packed as packed_lib
from tirjax.train_steps.batches import merge_microbatches, split_microbatches
from tirjax.train_steps.step import Placement, StepOptions, TrainStep


def packed_row_values(model, seqs: packed_lib.PackedSequences) -> jax.Array:
  """Values `[S, R, L]` of each row slot's tokens from a packed forward: the value of token i
  is the head on the hidden state of the token before it on its path (`prev`), as
  `ValueModel.values` reads position l − 1 of a row (0 at a root and where none is computed)."""
  hidden = model.trunk.packed_hidden(seqs.tokens, seqs.tree)
  v = model.head(hidden)  # [S, N]: V of the prefix through each packed token
  take = jax.vmap(lambda x, i: x[i])  # per sequence
  targets = seqs.targets
  before = take(seqs.prev, jnp.maximum(targets, 0))
  has_prev = (targets >= 0) & (before >= 0)
  at_targets = jnp.where(has_prev, take(v, jnp.maximum(before, 0)), 0.0)  # [S, Q]
  present = seqs.row_index >= 0
  index = jnp.maximum(seqs.row_index, 0)
  return jnp.where(present, take(at_targets, index), 0.0)


def value_tokens(value_mask: np.ndarray, token_valid: np.ndarray) -> np.ndarray:
  """The tokens whose values a pass computes: `value_mask` on valid tokens, never position 0
  (no prefix: its value is 0 on both paths)."""
  want = np.asarray(value_mask).astype(bool) & np.asarray(token_valid).astype(bool)
  want[:, 0] = False
  return want


class PackedValues:
  """The critic's values on packed forests: `(params, rollouts) -> [B, L]` on the loss tokens,
  each group's shared prefixes computed once; `packer`'s sizes are resumable state (saved
  with the checkpoint like the policy's passes', `tirjax.trainer.layouts`)."""

  def __init__(self, graphdef: nnx.GraphDef, place: Placement, opts: StepOptions):
    self.placement = place
    self.packer = packed_lib.Packer(place, opts)

    def values(params, seqs):
      model = nnx.merge(graphdef, params)
      mbs = split_microbatches(seqs, seqs.num_microbatches)
      return merge_microbatches(jax.lax.map(lambda mb: packed_row_values(model, mb), mbs))

    self.jitted = jax.jit(values, in_shardings=(place.params, place.batch),
                          out_shardings=place.batch)
    self._scatter = jax.jit(packed_lib.scatter_rows, out_shardings=place.batch)

  def __call__(self, params: nnx.State, rollouts: Any) -> jax.Array:
    local = packed_lib.local_rows
    share = self.packer.share(np.shape(rollouts.token_valid)[0])
    want = value_tokens(local(rollouts.loss_mask), local(rollouts.token_valid))
    lengths = packed_lib.last_token(want)
    seqs, _ = self.packer.pack(local(rollouts.tokens), lengths, local(rollouts.group_id),
                               np.flatnonzero(lengths > 0), share.start, needed=want)
    token_valid = jax.device_put(rollouts.token_valid, self.placement.batch)
    with jax.set_mesh(self.placement.mesh):
      return self._scatter(self.jitted(params, seqs), seqs.row_id, token_valid)


@flax.struct.dataclass(frozen=True)
class ValueRows:
  """A `CriticBatch`'s loss inputs in the packed row layout `[S, R, L]`."""

  old_values: jax.Array
  returns: jax.Array
  value_mask: jax.Array  # bool; False in empty slots


@flax.struct.dataclass(frozen=True)
class PackedCriticBatch:
  """The packed critic step's input: sequences, their rows' value-loss inputs, and
  `valid_tokens` [S] (real tokens of the mini-batch's rows, for `tokens/valid`; each process's
  total on its first sequence)."""

  seqs: packed_lib.PackedSequences
  rows: ValueRows
  valid_tokens: jax.Array

  @property
  def num_microbatches(self) -> int:
    return self.seqs.num_microbatches


def _gather_value_rows(fields: ValueRows, row_id: jax.Array, length: int) -> ValueRows:
  """`[B, L']` fields → `[S, R, length]` by `row_id` (empty slots out of the loss)."""
  out = packed_lib.gather_slots(fields, row_id, length)
  return out.replace(value_mask=out.value_mask.astype(bool) & (row_id >= 0)[..., None])


def packed_value_loss_fn(cliprange_value: Optional[float], aggregation: str,
                         norm_constant: Optional[float]):
  """`critic.value_loss_fn` on `PackedCriticBatch`es: the same loss of the same rows."""

  def loss_fn(model, mb: PackedCriticBatch):
    flat = lambda x: x.reshape((-1,) + x.shape[2:])  # [S, R, L] -> [S·R, L]
    vpreds = flat(packed_row_values(model, mb.seqs))
    rows = jax.tree.map(flat, mb.rows)
    out = value_loss(vpreds, rows.old_values, rows.returns, rows.value_mask, cliprange_value,
                     aggregation, norm_constant)
    counts = {"tokens/valid": jnp.sum(mb.valid_tokens), "tokens/value": out.clipfrac.den,
              "tokens/forwarded": jnp.float32(mb.seqs.tokens.size)}
    return out.loss, {"loss": out.loss, "clipfrac": out.clipfrac, "error": out.error}, counts

  return loss_fn


class PackedValueStep(TrainStep):
  """The critic's update (`critic.Critic.update`) on packed forests; `prepare` packs
  mini-batches. `packer`'s sizes are resumable state (`tirjax.trainer.layouts`)."""

  def __init__(self, graphdef: nnx.GraphDef, tx: optax.GradientTransformation,
               place: Placement, cliprange_value: Optional[float], aggregation: str,
               norm_constant: Optional[float], opts: StepOptions):
    super().__init__(graphdef, tx,
                     packed_value_loss_fn(cliprange_value, aggregation, norm_constant),
                     place, None)
    self.packer = packed_lib.Packer(place, opts)
    self._gather = jax.jit(_gather_value_rows, static_argnums=2, out_shardings=place.batch)

  def prepare(self, batch: Any, group_id: np.ndarray
              ) -> Callable[[Optional[np.ndarray]], PackedCriticBatch]:
    """`rows -> PackedCriticBatch` of those rows of `batch` (a `critic.CriticBatch`; global row
    ids, the same on every process; None: every row), each query group one forest of its
    rows that carry value-mask tokens, up to their last one."""
    local = packed_lib.local_rows
    share = self.packer.share(len(group_id))
    tokens, token_valid = local(batch.tokens), local(batch.token_valid)
    want = value_tokens(local(batch.value_mask), token_valid)
    groups = np.asarray(group_id)[share.start:share.stop]
    lengths = packed_lib.last_token(want)
    fields = jax.device_put(ValueRows(batch.old_values, batch.returns, batch.value_mask),
                            self.placement.batch)

    return packed_lib.row_selector(
        self.packer, self.placement, self._gather, fields, PackedCriticBatch,
        packed_lib.LocalRows(tokens, token_valid, lengths, groups, want, share))
