"""Forests packed into sequences by a token budget, in a few bucketed shapes (host side).

    forests = [forest.build(rows, seqs) for rows, seqs in groups]
    shapes = plan(forests, budget=16384, shards=1, block=64)   # then agreed across processes
    arrays = layout(forests, shapes)                            # numpy, [S, ...] leaves

A micro-batch is `shards` sequences, one per batch shard of the mesh, each of at most
`budget` tokens (unless one forest alone is longer: a forest never splits). The forests are
dealt into `M × shards` sequences by longest-first onto the least-loaded sequence (balanced,
so the sequence length N is small), or, where that overfills one, first-fit decreasing.

Every size that reaches a compiled program is bucketed (`bucket`), so that a run compiles a
handful of executables: the row length L and the rows per sequence R (the row layout, cheap)
to powers of two; the sequence length N (every layer pays for it) and the log-probs computed
Q to `steps` sizes per octave (4 by default: at most 25% padding; 2: 50%); the keys
per query block K (the attention pays N × K) to a whole number of blocks past the longest
row; the micro-batch count M is what the budget needs. A `Packer` then never lets a size
shrink within a run (`packed.Packer.ratchet`): on `make run`'s tiny model a packed update
takes ~0.1-1 s and a compilation ~7 s, so a run must compile few shapes, which the ratchet
bounds by how often a size grows, not by how many sizes there are.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from typing import Sequence

import numpy as np

from tirjax.train_steps.forest import Forest


def bucket(n: int, quantum: int, steps: int = 1) -> int:
  """The smallest q·m·2^e ≥ n with m ∈ [steps, 2·steps) (or q·m, m ≤ steps): `steps` sizes
  per octave; 1 gives powers of two (times q), 4 at most 25% padding."""
  units = max(1, math.ceil(n / quantum))
  if units <= steps:
    return units * quantum
  e = (units // steps).bit_length() - 1
  return math.ceil(units / 2**e) * 2**e * quantum


@dataclasses.dataclass(frozen=True)
class Shapes:
  """The static sizes of a packed batch (this process's share: `microbatches × shards`
  sequences).

  Attributes:
    microbatches: M, sequential micro-batches.
    shards: sequences per micro-batch on this process (its batch shards).
    length: N, tokens per sequence (a multiple of `block`).
    rows: R, row slots per sequence.
    row_length: L, tokens per row slot.
    keys: K, keys per query block.
    targets: Q, log-probs computed per sequence (of the tokens some row needs).
    block: the attention's query block.
  """

  microbatches: int
  shards: int
  length: int
  rows: int
  row_length: int
  keys: int
  targets: int
  block: int

  @property
  def sequences(self) -> int:
    return self.microbatches * self.shards

  @property
  def forwarded(self) -> int:
    """Positions the model runs (this process's), padding included."""
    return self.sequences * self.length

  def merge(self, other: "Shapes") -> "Shapes":
    """Sizes that fit both (each the larger): what every process uses."""
    return Shapes(*(max(a, b) for a, b in zip(dataclasses.astuple(self),
                                               dataclasses.astuple(other))))


def _first_fit(sizes: Sequence[int], capacity: int) -> list[list[int]]:
  bins, loads = [], []
  for g in sorted(range(len(sizes)), key=lambda g: -sizes[g]):
    for b, load in enumerate(loads):
      if load + sizes[g] <= capacity:
        bins[b].append(g)
        loads[b] += sizes[g]
        break
    else:
      bins.append([g])
      loads.append(sizes[g])
  return bins


def _balanced(sizes: Sequence[int], count: int) -> list[list[int]]:
  heap = [(0, b) for b in range(count)]
  bins = [[] for _ in range(count)]
  for g in sorted(range(len(sizes)), key=lambda g: -sizes[g]):
    load, b = heapq.heappop(heap)
    bins[b].append(g)
    heapq.heappush(heap, (load + sizes[g], b))
  return bins


def deal(sizes: Sequence[int], budget: int, shards: int, min_microbatches: int = 1
         ) -> list[list[int]]:
  """Forests (by size) into `M × shards` sequences of at most max(budget, largest) tokens,
  M as small as first-fit decreasing makes it (at least `min_microbatches`); each sequence
  lists its forests."""
  capacity = max([budget, *sizes])
  fitted = _first_fit(sizes, capacity)
  count = max(min_microbatches, math.ceil(len(fitted) / shards)) * shards
  balanced = _balanced(sizes, count)
  if max(sum(sizes[g] for g in b) for b in balanced) <= capacity:
    return balanced
  return fitted + [[] for _ in range(count - len(fitted))]


def ancestors_and_block(prev: np.ndarray, used: int, block: int) -> list[np.ndarray]:
  """Per query block of `[0, used)`: its first token's ancestors and the block's own tokens,
  ascending; they include every ancestor of every token of the block (see
  `tirjax.models.tree_attention`). Blocks past `used` read nothing."""
  i = np.arange(used)
  first = (prev[:used] != i - 1) | (i == 0)  # where a run of consecutive path tokens starts
  run_start = np.maximum.accumulate(np.where(first, i, 0))
  out = []
  for q0 in range(0, len(prev), block):
    if q0 >= used:
      out.append(np.zeros(0, np.int32))
      continue
    parts = [np.arange(q0, min(q0 + block, used))]
    j = prev[q0]
    while j >= 0:  # up the path, one run at a time
      s = run_start[j]
      parts.append(np.arange(s, j + 1))
      j = prev[s]
    out.append(np.unique(np.concatenate(parts)).astype(np.int32))
  return out


def plan(forests: Sequence[Forest], *, budget: int, shards: int, block: int,
         min_microbatches: int = 1, steps: int = 4) -> tuple[Shapes, list[list[int]]]:
  """The bucketed shapes of `forests` packed by `deal`, and which forests each sequence
  holds: N and Q with `steps` sizes per octave, K whole blocks (a block's keys are bounded
  by the longest row + block, `tree_attention`)."""
  sizes = [f.size for f in forests]
  bins = deal(sizes, budget, shards, min_microbatches)
  length = bucket(max([sum(sizes[g] for g in b) for b in bins] + [1]), block, steps)
  rows = max([sum(len(forests[g].rows) for g in b) for b in bins] + [1])
  row_length = max([len(idx) for f in forests for idx in f.index] + [1])
  targets = max([sum(int(forests[g].needed.sum()) for g in b) for b in bins] + [1])
  shapes = Shapes(microbatches=len(bins) // shards, shards=shards, length=length,
                  rows=1 << (rows - 1).bit_length(), row_length=bucket(row_length, 64),
                  # a block's keys: its first token's ancestors and itself (`tree_attention`);
                  # a whole number of blocks, not bucketed by octave: it follows the longest
                  # row, which reaches its bound early in a run, and attention pays N × K
                  keys=min(length, -(-(row_length - 1 + block) // block) * block),
                  targets=min(length, bucket(targets, block, steps)), block=block)
  return shapes, bins


def layout(forests: Sequence[Forest], bins: Sequence[Sequence[int]], shapes: Shapes
           ) -> dict[str, np.ndarray]:
  """The packed arrays, `[S, ...]` with S = `shapes.sequences` (bins past `len(bins)` are
  empty): tokens, positions, prev, seg_end, valid `[S, N]`; key_index, key_valid
  `[S, N / block, K]`; targets `[S, Q]` (the packed indices whose log-probs are computed,
  ascending, -1 past them); row_id `[S, R]` (the forests' row ids, -1 for an empty slot) and
  row_index `[S, R, L]` (where each row token's log-prob lies in `targets`, -1 where none
  is computed: past the row, or a token no row needs)."""
  s, n, r, l, k = (shapes.sequences, shapes.length, shapes.rows, shapes.row_length,
                   shapes.keys)
  nq = n // shapes.block
  out = dict(tokens=np.zeros((s, n), np.int32), positions=np.zeros((s, n), np.int32),
             prev=np.full((s, n), -1, np.int32), seg_end=np.full((s, n), -1, np.int32),
             valid=np.zeros((s, n), bool), key_index=np.zeros((s, nq, k), np.int32),
             key_valid=np.zeros((s, nq, k), bool),
             targets=np.full((s, shapes.targets), -1, np.int32),
             row_id=np.full((s, r), -1, np.int32), row_index=np.full((s, r, l), -1, np.int32))
  for seq, members in enumerate(bins):
    at, slot, first = 0, 0, 0  # this forest's first packed index, row slot, target
    for g in members:
      f = forests[g]
      span = slice(at, at + f.size)
      out["tokens"][seq, span] = f.tokens
      out["positions"][seq, span] = f.depth
      out["prev"][seq, span] = np.where(f.prev >= 0, f.prev + at, -1)
      out["seg_end"][seq, span] = f.seg_end + at
      out["valid"][seq, span] = True
      wanted = np.flatnonzero(f.needed)
      out["targets"][seq, first:first + len(wanted)] = wanted + at
      target_of = np.where(f.needed, np.cumsum(f.needed) - 1 + first, -1)
      for row, idx in zip(f.rows, f.index):
        out["row_id"][seq, slot] = row
        out["row_index"][seq, slot, :len(idx)] = target_of[idx]
        slot += 1
      at, first = at + f.size, first + len(wanted)
    for b, keys in enumerate(ancestors_and_block(out["prev"][seq], at, shapes.block)):
      assert len(keys) <= k, (len(keys), k)  # bounded by the longest row + block
      out["key_index"][seq, b, :len(keys)] = keys
      out["key_valid"][seq, b, :len(keys)] = True
  return out
