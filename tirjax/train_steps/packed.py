"""The policy update and its log-prob passes on packed forests: every token computed once.

    step = policy_step(graphdef, tx, place, loss_opts, StepOptions(packed=True))
    select = step.prepare(policy_batch(rollouts, adv), group_id)   # host: tries, packing
    state, metrics = step(state, select(rows))                     # rows of a mini-batch

The padded path forwards every `[B, L]` row whole: a group's prompt once per row (6 times in
the default, 16 in HiDiffTIR's protocol), a tree's shared steps once per leaf below them, and
every row's padding. Here each query group's rows become one forest (`forest.build`: the trie
of their tokens in depth-first order), the forests are packed into sequences of at most
`max_tokens_per_microbatch` tokens per batch shard (`packing`), and the decoder runs them with
tree attention (`tirjax.models.tree_attention`): a token reads exactly the keys it reads in
its padded row, at the same positions, so its hidden state, log-prob and entropy are the
padded path's.

Why one mechanism (a tree mask over a packed trie) rather than "prefix once, then suffixes
over its KV" (Prefix Grouper) or prefixes level by level: it covers the group prompt, the
trees' deeper sharing, padding removal and packing several groups into one sequence alike,
and keeps the model a single forward (one layer scan, autodiff as usual). Blockwise key
gathering keeps attention at (longest row + block) keys per token instead of the packed
length.

The loss is unchanged: log-probs are gathered back into the row layout `[S, R, L]` (each row
slot's tokens' packed indices) and `policy_loss` runs on those rows, so every aggregation
mode, KL and entropy term, and the (sum, den) accumulation are the padded path's. A token
shared by several rows has one log-prob; the gather's autodiff sums the rows' gradients into
it, so a shared prefix's gradient is exact. Only rows with loss tokens, up to their last loss
token, are packed for the update (nothing after it can move the loss), and logits are
computed for loss tokens only (the padded path computes them at every position, prompt and
tool responses included); the log-prob passes compute the tokens they are asked for (every
valid one by default; a run's reference and π_old passes, the generated ones). A group never
splits across sequences, so sharding the sequences (and their row slots) over the batch axes
keeps each row with its tokens, and a process packs only its own rows; the shapes are agreed
across processes.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from tirjax import distributed, sharding
from tirjax.loss import objective
from tirjax.models.logprobs import packed_logprobs
from tirjax.models.tree_attention import TreeMask
from tirjax.train_steps import forest, packing
from tirjax.train_steps.batches import PolicyBatch, merge_microbatches, split_microbatches
from tirjax.train_steps.step import Placement, StepOptions, TrainStep, policy_terms


@flax.struct.dataclass(frozen=True)
class PackedSequences:
  """Packed forests `[S, N]` and where each row slot's tokens lie in them.

  Attributes:
    tokens, prev: [S, N] int32; `prev[i]` the token before i on its path (-1: none).
    tree: the attention pattern (`TreeMask`).
    targets: [S, Q] int32, the tokens whose log-probs are computed (-1: none).
    row_id: [S, R] int32, the batch row in each slot (-1: an empty slot).
    row_index: [S, R, L] int32, where each slot token's log-prob lies in `targets` (-1: not
      computed).
    num_microbatches: M; the sequences are split as `split_microbatches` splits rows.
  """

  tokens: jax.Array
  prev: jax.Array
  tree: TreeMask
  targets: jax.Array
  row_id: jax.Array
  row_index: jax.Array
  num_microbatches: int = flax.struct.field(pytree_node=False, default=1)


@flax.struct.dataclass(frozen=True)
class LossRows:
  """A `PolicyBatch`'s loss inputs in the packed row layout, `[S, R, L]` / `[S, R]`."""

  loss_mask: jax.Array
  old_logprobs: jax.Array
  advantages: jax.Array
  row_mask: jax.Array
  ref_logprobs: Optional[jax.Array] = None
  sampler_logprobs: Optional[jax.Array] = None  # a rollout correction's (TIS / MIS)


@flax.struct.dataclass(frozen=True)
class PackedBatch:
  """The packed policy step's input: sequences, their rows' loss inputs, and `valid_tokens`
  [S] (real tokens of the mini-batch's rows, for `tokens/valid`; each process's total on its
  first sequence)."""

  seqs: PackedSequences
  rows: LossRows
  valid_tokens: jax.Array

  @property
  def num_microbatches(self) -> int:
    return self.seqs.num_microbatches


def row_logprobs(model, seqs: PackedSequences, *, chunk_size: int, temperature: float = 1.0,
                 with_entropy: bool = False) -> tuple[jax.Array, Optional[jax.Array]]:
  """Log-probs (and entropies) `[S, R, L]` of each row slot's tokens, as the padded path's
  `token_logprobs` gives them for its row (0 at its first token and past its end)."""
  hidden = model.packed_hidden(seqs.tokens, seqs.tree)
  logp, entropy = packed_logprobs(hidden, model.unembedding, seqs.tokens, seqs.prev,
                                  seqs.targets, chunk_size=chunk_size,
                                  temperature=temperature, with_entropy=with_entropy)
  present = seqs.row_index >= 0
  index = jnp.maximum(seqs.row_index, 0)

  def to_rows(x):  # [S, Q] -> [S, R, L]
    return jnp.where(present, jax.vmap(lambda xs, i: xs[i])(x, index), 0.0)

  return to_rows(logp), (to_rows(entropy) if with_entropy else None)


def local_rows(x) -> np.ndarray:
  """This process's rows of a batch field (host or global array)."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return distributed.local_rows(x)
  return np.asarray(x)


class Packer:
  """Packs rows of this process's share of a batch into placed `PackedSequences`.

  Its shapes only grow: each size but the micro-batch count is at least the largest this
  packer has used (`ratchet`), so a run compiles once per size that grows, a handful in all,
  not once per combination of bucketed sizes (how many compiled before and after:
  benchmarks/results/make_run_time.json). A smaller batch then pays padding up to the
  largest shape so far, which costs far less than a compilation.

  The sizes used so far are therefore part of a run's state: a step's layout depends on the
  steps before it, and XLA's CPU kernels do not add a padded reduction in the same order at
  two lengths, so a run resumed with a fresh packer computes other float32 roundings than the
  uninterrupted run. `saved` and `resume` carry them through a checkpoint
  (`tirjax.trainer.layouts`)."""

  def __init__(self, place: Placement, opts: StepOptions):
    self.place = place
    self.opts = opts
    self.shards = sharding.local_batch_shards(place.mesh, place.rules)
    self.high: Optional[packing.Shapes] = None  # the largest sizes used so far

  def ratchet(self, shapes: packing.Shapes) -> packing.Shapes:
    """`shapes` grown to the largest sizes used so far (the micro-batch count as given: more
    micro-batches would compute whole empty sequences), remembered for the next."""
    if self.high is not None:
      shapes = dataclasses.replace(shapes.merge(self.high), microbatches=shapes.microbatches)
    self.high = shapes
    return shapes

  def saved(self) -> Optional[list[int]]:
    """The largest sizes used so far, as JSON (None before the first `pack`)."""
    return None if self.high is None else list(dataclasses.astuple(self.high))

  def resume(self, saved: Optional[list[int]]) -> None:
    """Continue from sizes `saved` gives (`saved()` of the run's packer at its checkpoint;
    None: nothing packed yet).

    Raises:
      ValueError: `saved` is not a list of `Shapes`' sizes, or was packed for another
        number of batch shards or another attention block.
    """
    if saved is None:
      self.high = None
      return
    names = [f.name for f in dataclasses.fields(packing.Shapes)]
    if (not isinstance(saved, (list, tuple)) or len(saved) != len(names)
        or not all(isinstance(v, int) and v >= 0 for v in saved)):
      raise ValueError(f"packed shapes {saved!r}: expected {len(names)} sizes "
                       f"({', '.join(names)})")
    high = packing.Shapes(*saved)
    if (high.shards, high.block) != (self.shards, self.opts.attention_block):
      raise ValueError(f"packed shapes {saved!r}: saved for {high.shards} batch shards and "
                       f"attention block {high.block}, this run has {self.shards} and "
                       f"{self.opts.attention_block}")
    self.high = high

  def share(self, rows: int) -> distributed.RowShare:
    return distributed.row_share(self.place.mesh, self.place.rules, rows)

  def pack(self, tokens: np.ndarray, lengths: np.ndarray, group_id: np.ndarray,
           rows: np.ndarray, row_offset: int, needed: Optional[np.ndarray] = None
           ) -> tuple[PackedSequences, packing.Shapes]:
    """`rows` (indices into this process's `tokens [B_p, L]`), each its first `lengths[r]`
    tokens, one forest per group of `group_id [B_p]`; row ids are placed as
    `row_offset + r` (this process's first row in the global batch). `needed [B_p, L]`:
    the tokens whose log-probs are wanted (default: all)."""
    rows = np.asarray(rows, np.int64)
    forests = []
    groups = group_id[rows]
    for g in dict.fromkeys(groups.tolist()):  # groups in the order they appear
      members = rows[groups == g]
      forests.append(forest.build(
          members, [tokens[r, :lengths[r]] for r in members],
          None if needed is None else [needed[r, :lengths[r]] for r in members]))
    opts = self.opts
    shapes, bins = packing.plan(forests, budget=opts.max_tokens_per_microbatch,
                                shards=self.shards, block=opts.attention_block,
                                min_microbatches=opts.num_microbatches,
                                steps=opts.bucket_steps)
    shapes = self.ratchet(packing.Shapes(*distributed.global_maxima(
        dataclasses.astuple(shapes))))
    bins = list(bins) + [[]] * (shapes.sequences - len(bins))
    a = packing.layout(forests, bins, shapes)
    a["row_id"] = np.where(a["row_id"] >= 0, a["row_id"] + row_offset, -1).astype(np.int32)
    a = sharding.shard_batch(a, self.place.mesh, self.place.rules)
    tree = TreeMask(positions=a["positions"], seg_end=a["seg_end"], valid=a["valid"],
                    key_index=a["key_index"], key_valid=a["key_valid"])
    return PackedSequences(tokens=a["tokens"], prev=a["prev"], tree=tree,
                           targets=a["targets"], row_id=a["row_id"], row_index=a["row_index"],
                           num_microbatches=shapes.microbatches), shapes


def fit_length(x: jax.Array, length: int) -> jax.Array:
  """`[..., L']` cut or zero-padded to `[..., length]`."""
  if x.shape[-1] >= length:
    return x[..., :length]
  return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, length - x.shape[-1])])


def gather_slots(fields: Any, row_id: jax.Array, length: int) -> Any:
  """Each leaf `[B, L']` (or `[B]`) of `fields` → `[S, R, length]` (`[S, R]`) by `row_id
  [S, R]`; an empty slot holds row 0's values, so its caller masks it out of the loss."""
  out = jax.tree.map(lambda x: x[jnp.maximum(row_id, 0)], fields)
  return jax.tree.map(lambda x: fit_length(x, length) if x.ndim == 3 else x, out)


def _gather_rows(fields: LossRows, row_id: jax.Array, length: int) -> LossRows:
  """`[B, L']` fields → `[S, R, length]` by `row_id [S, R]` (empty slots out of the loss)."""
  out = gather_slots(fields, row_id, length)
  return out.replace(row_mask=out.row_mask.astype(bool) & (row_id >= 0))


def packed_policy_loss_fn(loss_opts: objective.LossOptions, opts: StepOptions):
  """`policy_loss_fn` on `PackedBatch`es: the same loss of the same rows."""
  with_entropy = loss_opts.entropy_coef > 0 or opts.log_entropy

  def loss_fn(model, mb: PackedBatch):
    logp, entropy = row_logprobs(model, mb.seqs, chunk_size=opts.logprob_chunk_size,
                                 temperature=opts.temperature, with_entropy=with_entropy)
    flat = lambda x: x.reshape((-1,) + x.shape[2:])
    out, counts = policy_terms(flat(logp), None if entropy is None else flat(entropy),
                               jax.tree.map(flat, mb.rows), loss_opts)
    counts["tokens/valid"] = jnp.sum(mb.valid_tokens)
    counts["tokens/forwarded"] = jnp.float32(mb.seqs.tokens.size)
    return out.loss, out, counts

  return loss_fn


def last_token(mask: np.ndarray) -> np.ndarray:
  """Per row, one past its last token in `mask` (0 without any)."""
  cols = np.arange(1, mask.shape[1] + 1)
  return np.max(np.where(mask, cols, 0), axis=1)


class PackedPolicyStep(TrainStep):
  """The policy step (`policy_step.policy_step`) on packed forests; `prepare` packs mini-batches."""

  def __init__(self, graphdef: nnx.GraphDef, tx: optax.GradientTransformation,
               place: Placement, loss_opts: objective.LossOptions, opts: StepOptions):
    super().__init__(graphdef, tx, packed_policy_loss_fn(loss_opts, opts), place, None)
    self.packer = Packer(place, opts)
    self._gather = jax.jit(_gather_rows, static_argnums=2, out_shardings=place.batch)

  def prepare(self, batch: PolicyBatch, group_id: np.ndarray
              ) -> Callable[[Optional[np.ndarray]], PackedBatch]:
    """`rows -> PackedBatch` of those rows of `batch` (global row ids, the same on every
    process; None: every row), each query group one forest of its rows that carry loss
    tokens, up to their last one."""
    share = self.packer.share(len(group_id))
    tokens, token_valid = local_rows(batch.tokens), local_rows(batch.token_valid)
    loss_mask, row_mask = local_rows(batch.loss_mask).astype(bool), local_rows(batch.row_mask)
    groups = np.asarray(group_id)[share.start:share.stop]
    lengths = last_token(loss_mask & row_mask.astype(bool)[:, None])
    fields = jax.device_put(LossRows(batch.loss_mask, batch.old_logprobs, batch.advantages,
                                     batch.row_mask, batch.ref_logprobs,
                                     batch.sampler_logprobs),
                            self.placement.batch)

    return row_selector(self.packer, self.placement, self._gather, fields, PackedBatch,
                        LocalRows(tokens, token_valid, lengths, groups, loss_mask, share))


@dataclasses.dataclass(frozen=True)
class LocalRows:
  """This process's share of a batch as the packer reads it: `tokens`, `token_valid`
  `[B_p, L]`, each row's packed length `lengths [B_p]`, query group `groups [B_p]`, the tokens
  whose log-probs are `needed [B_p, L]`, and which global rows these are (`share`)."""
  tokens: np.ndarray
  token_valid: np.ndarray
  lengths: np.ndarray
  groups: np.ndarray
  needed: np.ndarray
  share: distributed.RowShare


def row_selector(packer: Packer, place: Placement, gather: Callable, fields: Any,
                 batch_class: type, local: LocalRows) -> Callable[[Optional[np.ndarray]], Any]:
  """`rows -> batch_class(seqs, rows, valid_tokens)`: those global rows (None: every row) that
  are this process's and carry a needed token, packed by `packer`, their per-token `fields`
  gathered into row slots by `gather` (the policy's and the critic's packed steps share it)."""

  def select(rows: Optional[np.ndarray]):
    share = local.share
    mine = np.arange(len(local.tokens))
    if rows is not None:
      rows = np.asarray(rows)
      mine = rows[(rows >= share.start) & (rows < share.stop)] - share.start
    seqs, shapes = packer.pack(local.tokens, local.lengths, local.groups,
                               mine[local.lengths[mine] > 0], share.start, needed=local.needed)
    valid = np.zeros(shapes.sequences, np.float32)
    valid[0] = np.sum(local.token_valid[mine])
    with jax.set_mesh(place.mesh):
      rows_in = gather(fields, seqs.row_id, shapes.row_length)
    return batch_class(seqs=seqs, rows=rows_in, valid_tokens=sharding.shard_batch(
        valid, place.mesh, place.rules))

  return select


def scatter_rows(rows: jax.Array, row_id: jax.Array, token_valid: jax.Array) -> jax.Array:
  """Row slots `[S, R, L]` back into the batch's `[B, L']` (zeros where no slot is)."""
  b, length = token_valid.shape
  ids = jnp.where(row_id >= 0, row_id, b).reshape(-1)  # b: out of range, dropped
  values = fit_length(rows.reshape((-1,) + rows.shape[2:]), length)
  return jnp.zeros((b, length), jnp.float32).at[ids].set(values, mode="drop")


class PackedLogprobs:
  """`TokenLogprobs` on packed forests: `(params, tokens, token_valid, group_id) -> [B, L]`
  log-probs of every valid token, each group's shared prefixes computed once. `jitted`, the
  forward, compiles per packed shape (not per batch length); a small scatter places its rows
  back."""

  def __init__(self, graphdef: nnx.GraphDef, place: Placement, opts: StepOptions):
    self.placement = place
    self.packer = Packer(place, opts)
    self.last_shapes: Optional[packing.Shapes] = None

    def logprobs(params, seqs: PackedSequences):
      model = nnx.merge(graphdef, params)
      one = functools.partial(row_logprobs, model, chunk_size=opts.logprob_chunk_size,
                              temperature=opts.temperature)
      mbs = split_microbatches(seqs, seqs.num_microbatches)
      return merge_microbatches(jax.lax.map(lambda mb: one(mb)[0], mbs))  # [S, R, L]

    self.jitted = jax.jit(logprobs, in_shardings=(place.params, place.batch),
                          out_shardings=place.batch)
    self._scatter = jax.jit(scatter_rows, out_shardings=place.batch)

  def __call__(self, params: nnx.State, tokens: Any, token_valid: Any, group_id: Any,
               needed: Any = None) -> jax.Array:
    """`needed [B, L]` (default: every valid token): the tokens whose log-probs are computed;
    each row is packed up to its last one."""
    share = self.packer.share(np.shape(token_valid)[0])
    want = local_rows(token_valid if needed is None else needed).astype(bool)
    want &= local_rows(token_valid).astype(bool)
    want[:, 0] = False  # a row's first token has no log-prob
    lengths = last_token(want)
    seqs, self.last_shapes = self.packer.pack(local_rows(tokens), lengths, local_rows(group_id),
                                              np.flatnonzero(lengths > 0), share.start,
                                              needed=want)
    token_valid = jax.device_put(token_valid, self.placement.batch)
    with jax.set_mesh(self.placement.mesh):
      return self._scatter(self.jitted(params, seqs), seqs.row_id, token_valid)
