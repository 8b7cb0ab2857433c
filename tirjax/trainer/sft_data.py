"""Supervised warm-start data: demonstration token ids with an assistant-only loss mask.

Batches are a pure function of the step (an epoch-seeded permutation), so a resumed run
sees exactly the batches an uninterrupted run would. Rows of similar length are batched
together (within pools of `POOL` batches of the permutation, as t5x and fairseq bucket) and a
batch is cut to its longest row rounded up to `multiple`: on toolworld this drops most of
the padding, at the price of one compiled SFT step per width.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

POOL = 8  # batches per length-sorted pool


@dataclasses.dataclass(frozen=True)
class SFTData:
  tokens: np.ndarray  # [N, L] int32, right-padded
  token_valid: np.ndarray  # [N, L] bool
  loss_mask: np.ndarray  # [N, L] bool: assistant tokens (their <|im_end|> included)
  seed: int = 0
  skipped: int = 0  # demonstrations longer than L
  multiple: int = 64  # batch widths are multiples of this

  @classmethod
  def from_sequences(cls, seqs: Sequence[tuple[Sequence[int], Sequence[int]]], max_tokens: int,
                     seed: int = 0, multiple: int = 64) -> "SFTData":
    """Pads to the longest demonstration rounded up to `multiple`, at most `max_tokens`
    (attention is quadratic in the padded length); longer demonstrations are skipped."""
    keep = [(ids, mask) for ids, mask in seqs if len(ids) <= max_tokens]
    if not keep:
      raise ValueError(f"sft: no demonstration fits in {max_tokens} tokens")
    longest = max(len(ids) for ids, _ in keep)
    max_tokens = min(max_tokens, -(-longest // multiple) * multiple)
    n = len(keep)
    tokens = np.zeros((n, max_tokens), np.int32)
    valid = np.zeros((n, max_tokens), bool)
    loss = np.zeros((n, max_tokens), bool)
    for i, (ids, mask) in enumerate(keep):
      tokens[i, :len(ids)] = ids
      valid[i, :len(ids)] = True
      loss[i, :len(mask)] = np.asarray(mask, bool)
    return cls(tokens, valid, loss, seed, skipped=len(seqs) - n, multiple=multiple)

  def __len__(self) -> int:
    return self.tokens.shape[0]

  def batch(self, step: int, batch_size: int) -> dict[str, np.ndarray]:
    """Batch `step` (0-based). An epoch is `len // batch_size` batches of a seeded permutation
    (the remainder waits for a later epoch's order); pools of `POOL` consecutive batches are
    sorted by length, cut into batches, and those batches shuffled."""
    n = len(self)
    if batch_size > n:
      raise ValueError(f"sft.batch_size: {batch_size} exceeds the {n} demonstrations")
    per_epoch = n // batch_size
    epoch, k = divmod(step, per_epoch)
    rng = np.random.default_rng([self.seed, epoch])
    order = rng.permutation(n)[:per_epoch * batch_size]
    pool_start = (k // POOL) * POOL
    pool_batches = min(POOL, per_epoch - pool_start)
    pool = order[pool_start * batch_size:(pool_start + pool_batches) * batch_size]
    lengths = self.token_valid[pool].sum(axis=1)
    pool = pool[np.argsort(lengths, kind="stable")]
    shuffled = rng.permutation(per_epoch)  # drawn after the order: the same for every k
    within = np.argsort(shuffled[pool_start:pool_start + pool_batches])[k - pool_start]
    idx = pool[within * batch_size:(within + 1) * batch_size]
    width = int(self.token_valid[idx].sum(axis=1).max())
    width = min(self.tokens.shape[1], -(-width // self.multiple) * self.multiple)
    return {"tokens": self.tokens[idx, :width], "token_valid": self.token_valid[idx, :width],
            "loss_mask": self.loss_mask[idx, :width]}

