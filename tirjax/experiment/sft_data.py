"""Supervised warm-start data: demonstration token ids with an assistant-only loss mask.

Batches are a pure function of the step (an epoch-seeded permutation), so a resumed run
sees exactly the batches an uninterrupted run would.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class SFTData:
  tokens: np.ndarray  # [N, L] int32, right-padded
  token_valid: np.ndarray  # [N, L] bool
  loss_mask: np.ndarray  # [N, L] bool: assistant tokens (their <|im_end|> included)
  seed: int = 0
  skipped: int = 0  # demonstrations longer than L

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
    return cls(tokens, valid, loss, seed, skipped=len(seqs) - n)

  def __len__(self) -> int:
    return self.tokens.shape[0]

  def batch(self, step: int, batch_size: int) -> dict[str, np.ndarray]:
    """Batch `step` (0-based): rows `step*batch_size ...` of the concatenated epoch orders."""
    n = len(self)
    start = step * batch_size
    idx = []
    while len(idx) < batch_size:
      epoch, offset = divmod(start + len(idx), n)
      order = np.random.default_rng([self.seed, epoch]).permutation(n)
      idx.extend(order[offset:offset + batch_size - len(idx)])
    idx = np.asarray(idx)
    return {"tokens": self.tokens[idx], "token_valid": self.token_valid[idx],
            "loss_mask": self.loss_mask[idx]}


def demonstrations(tasks, tokenizer, options, num: int, seed: int = 0):
  """(token ids, loss mask) of `num` toolworld demonstrations (correct and imperfect ones)."""
  from tirjax.env.toolworld.demos import demo_tokens, make_demos
  return [demo_tokens(tokenizer, d) for d in make_demos(tasks[:num], seed=seed, options=options)]
