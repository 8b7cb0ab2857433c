"""A query group's rows laid out once: the token trie of the rows, in depth-first order.

Rows that start with the same tokens share them: a group's prompt, and in a PORTool / ARPO /
Tree-GRPO tree every step above a fork. Under a causal decoder a token's hidden state depends
only on the tokens before it, so rows that agree on a prefix agree on its hidden states, and
the prefix need be computed once. The trie of the rows' token sequences holds each distinct
prefix once; it is read from the token ids themselves, so it shares whatever the rows share
(the prompt, a tree's steps, and identical steps sampled by chance) without trusting
`node_id`, and it is exact by construction.

Sorted lexicographically, row k's longest common prefix with any earlier row is its common
prefix with row k − 1, so laying the rows out in that order, each adding only the tokens
after that prefix, is a depth-first walk of the trie:

* each packed token's path (root to token) is its row's prefix, so its position is its depth;
* a token's subtree (the tokens of every row through it) is the contiguous range
  `[i, seg_end[i]]`, since the rows through it are consecutive in sorted order;
* `prev[i]`, the token before i on its path, is where i's log-prob is read from.

The JAX sampler's prefix cache (`tirjax.sampling.prefix_cache`) finds, for one prompt, the
stored row with its longest prefix; the update needs the whole trie of a group at once,
which the sort gives directly, so it does not go through that cache.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class Forest:
  """One group's rows as a packed forest of F tokens.

  Attributes:
    tokens, depth, prev, seg_end: [F] int32; `prev` -1 at a root (a row's first token).
    rows: [n] the rows laid out (ids as given, in input order).
    index: n arrays, `index[k][t]` the packed index of token t of `rows[k]`.
    needed: [F] bool, tokens whose log-prob some row needs.
  """

  tokens: np.ndarray
  depth: np.ndarray
  prev: np.ndarray
  seg_end: np.ndarray
  rows: np.ndarray
  index: tuple
  needed: np.ndarray

  @property
  def size(self) -> int:
    return len(self.tokens)


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
  m = min(len(a), len(b))
  diff = np.flatnonzero(a[:m] != b[:m])
  return int(diff[0]) if diff.size else m


def build(rows: Sequence[int], sequences: Sequence[np.ndarray],
          needed: Optional[Sequence[np.ndarray]] = None) -> Forest:
  """The forest of `sequences` (each row's tokens, at least one each), ids `rows`; `needed`
  (per row, a bool per token; default all) marks the tokens whose log-probs are wanted."""
  if len(rows) != len(sequences) or (needed is not None and len(needed) != len(rows)):
    raise ValueError(f"rows: {len(rows)} ids for {len(sequences)} sequences"
                     + ("" if needed is None else f" and {len(needed)} masks"))
  seqs = [np.asarray(s, np.int32) for s in sequences]
  if any(s.ndim != 1 or s.size == 0 for s in seqs):
    raise ValueError("sequences: each row needs at least one token (a 1-D array)")
  order = sorted(range(len(seqs)), key=lambda k: seqs[k].tolist())
  index: list = [None] * len(seqs)
  parts, size, last = [], 0, None
  for k in order:
    s = seqs[k]
    shared = 0 if last is None else _common_prefix(seqs[last], s)
    new = np.arange(size, size + len(s) - shared, dtype=np.int32)
    index[k] = np.concatenate([index[last][:shared], new]) if shared else new
    prev = index[k][shared - 1:-1] if shared else np.concatenate([[-1], new[:-1]])
    parts.append((s[shared:], np.arange(shared, len(s), dtype=np.int32), prev))
    size, last = size + len(new), k
  tokens, depth, prev = (np.concatenate([p[i] for p in parts]).astype(np.int32)
                         for i in range(3))
  seg_end = np.zeros(size, np.int32)
  want = np.zeros(size, bool)
  for k, idx in enumerate(index):  # a token's subtree ends where the last row through it ends
    np.maximum.at(seg_end, idx, idx[-1])
    want[idx[np.asarray(needed[k], bool)] if needed is not None else idx] = True
  return Forest(tokens, depth, prev, seg_end, np.asarray(rows), tuple(index), want)
