"""The SFT step on packed forests: each demonstration's shared prefix computed once.

    step = sft_step(graphdef, tx, place, sft_opts, StepOptions(packed=True))
    state, metrics = step(state, sft_batch)             # an `SFTBatch`, packed on the host

A batch of demonstrations shares more than it looks: on toolworld every demonstration starts
with the same system prompt (the tools' docs), which is most of a short one. The padded step
(`step.sft_step`) forwards every `[B, L]` row whole, that prompt once per row and every row's
padding with it. Here the batch's rows become forests (`forest.build`: the trie of their
tokens), packed as the policy update packs a query group's rows (`packed.Packer`), and the
decoder runs them with tree attention, so each token's log-prob is the padded row's.

The loss is the padded step's: the log-probs are gathered back into row slots `[S, R, L]`
(`packed.row_logprobs`) with each row's own target mask (`sft.target_mask`), and `sft_loss`
aggregates them, so every aggregation mode and the (sum, den) accumulation are unchanged;
the gather's autodiff sums the rows' gradients into a shared token. Only target tokens get
logits, and a row is packed up to its last target token.

Which rows share a forest: the batch's rows in lexicographic order of their tokens (so that
rows with a common prefix are neighbours) cut into at least one run per batch shard, each
run closed before its trie would pass `max_tokens_per_microbatch` (a forest never splits,
so an unbounded one would be one micro-batch of any size).
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from tirjax import distributed, sharding
from tirjax.train_steps import sft as sft_lib
from tirjax.train_steps.batches import SFTBatch
from tirjax.train_steps.packed import Packer, PackedSequences, fit_length, last_token, row_logprobs
from tirjax.train_steps.step import Placement, StepOptions, TrainStep


@flax.struct.dataclass(frozen=True)
class PackedSFTBatch:
  """Packed demonstrations: `seqs`, each row slot's target mask `[S, R, L]`, and
  `valid_tokens [S]` (the rows' real tokens, each process's total on its first sequence)."""

  seqs: PackedSequences
  mask: jax.Array
  valid_tokens: jax.Array

  @property
  def num_microbatches(self) -> int:
    return self.seqs.num_microbatches


def host_target_mask(token_valid: np.ndarray, loss_mask: np.ndarray) -> np.ndarray:
  """`sft.target_mask` on host arrays: `loss_mask ∧ valid[i] ∧ valid[i−1]`, never position 0."""
  valid = np.asarray(token_valid, bool)
  pair = np.zeros_like(valid)
  pair[:, 1:] = valid[:, 1:] & valid[:, :-1]
  return np.asarray(loss_mask, bool) & pair


def forest_groups(tokens: np.ndarray, lengths: np.ndarray, runs: int, budget: int
                  ) -> np.ndarray:
  """A group id per row `[B]`: the rows in lexicographic order of their first `lengths`
  tokens, cut into `runs` equal runs and each run again wherever its trie (the sum over
  its rows of the tokens after the common prefix with the previous row) would pass
  `budget`."""
  seqs = [np.asarray(tokens[r, :lengths[r]]) for r in range(len(lengths))]
  order = sorted(range(len(seqs)), key=lambda r: seqs[r].tolist())
  group = np.zeros(len(seqs), np.int32)
  gid = -1
  for run in np.array_split(np.asarray(order, np.int64), max(runs, 1)):
    size, last = budget + 1, None  # the run's first row opens a group
    for r in run:
      s = seqs[r]
      new = len(s)
      if last is not None:
        m = min(len(s), len(last))
        diff = np.flatnonzero(s[:m] != last[:m])
        new -= int(diff[0]) if diff.size else m
      if size + new > budget:
        gid, size, new = gid + 1, 0, len(s)
      group[r], size, last = gid, size + new, s
  return group


def _gather_mask(mask: jax.Array, row_id: jax.Array, length: int) -> jax.Array:
  """`[B, L']` → `[S, R, length]` by `row_id [S, R]`, false in empty slots."""
  out = fit_length(mask[jnp.maximum(row_id, 0)], length)
  return out & (row_id >= 0)[..., None]


def packed_sft_loss_fn(sft_opts: sft_lib.SFTLossOptions, opts: StepOptions):
  """`step.sft_loss_fn` on `PackedSFTBatch`es: the same loss of the same rows."""

  def loss_fn(model, mb: PackedSFTBatch):
    logp, _ = row_logprobs(model, mb.seqs, chunk_size=opts.logprob_chunk_size)
    flat = lambda x: x.reshape((-1,) + x.shape[2:])
    nll = sft_lib.sft_loss(flat(logp), flat(mb.mask), sft_opts)
    counts = {"tokens/loss": jnp.sum(mb.mask, dtype=jnp.float32),
              "tokens/valid": jnp.sum(mb.valid_tokens),
              "tokens/forwarded": jnp.float32(mb.seqs.tokens.size)}
    return nll, {"loss": nll}, counts

  return loss_fn


def _local(x: Any, share: distributed.RowShare) -> np.ndarray:
  """This process's rows of a batch field: a placed global array's own rows, or the block
  `share` of host arrays (every process holds the whole batch)."""
  if isinstance(x, jax.Array):
    return distributed.local_rows(x)
  return np.asarray(x)[share.start:share.stop]


class PackedSFTStep(TrainStep):
  """The SFT step (`step.sft_step`) on packed demonstrations; takes `SFTBatch`es."""

  def __init__(self, graphdef: nnx.GraphDef, tx: optax.GradientTransformation,
               place: Placement, sft_opts: sft_lib.SFTLossOptions, opts: StepOptions):
    super().__init__(graphdef, tx, packed_sft_loss_fn(sft_opts, opts), place, None)
    self.packer = Packer(place, opts)
    self.opts = opts
    self._gather = jax.jit(_gather_mask, static_argnums=2, out_shardings=place.batch)

  def pack(self, batch: SFTBatch) -> PackedSFTBatch:
    """`batch`'s rows (this process's share) as packed forests, placed."""
    share = self.packer.share(np.shape(batch.tokens)[0])
    tokens, valid = _local(batch.tokens, share), _local(batch.token_valid, share)
    target = host_target_mask(valid, _local(batch.loss_mask, share))
    lengths = last_token(target)
    groups = forest_groups(tokens, lengths, self.packer.shards,
                           self.opts.max_tokens_per_microbatch)
    seqs, shapes = self.packer.pack(tokens, lengths, groups, np.flatnonzero(lengths > 0),
                                    share.start, needed=target)
    full = jax.device_put(sft_lib.target_mask(batch.token_valid, batch.loss_mask)
                          if isinstance(batch.tokens, jax.Array)
                          else host_target_mask(batch.token_valid, batch.loss_mask),
                          self.placement.batch)
    counted = np.zeros(shapes.sequences, np.float32)
    counted[0] = valid.sum()
    with jax.set_mesh(self.placement.mesh):
      mask = self._gather(full, seqs.row_id, shapes.row_length)
    return PackedSFTBatch(seqs=seqs, mask=mask, valid_tokens=sharding.shard_batch(
        counted, self.placement.mesh, self.placement.rules))

  def __call__(self, state, batch: SFTBatch):
    return super().__call__(state, self.pack(batch))
