"""The JAX sampler's prefix cache: the last call's KV caches, found again by token prefix.

A multi-turn episode samples its next step from everything it has seen: the previous call's
prompt, the tokens sampled then, and the tool response appended since. The previous call
already holds the keys and values of all but the last of those tokens, so the sampler keeps
that call's cache and, like vLLM's automatic prefix caching, continues any new prompt that
extends one of its rows: only the new tokens are computed (`kv_cache.extend`). Rows of a
PORTool tree that share a prefix continue the same cached row, so their prefix is computed
once.

A row of the last call is stored under its prompt plus its sampled tokens but the last one
(the decode loop never feeds the last token back, so its key and value are not cached). New
weights make every entry stale: `clear` drops them.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import jax

_MOD = (1 << 61) - 1
_BASE = 1_000_003


def prefix_hashes(ids: Sequence[int]) -> list[int]:
  """h[L] for every prefix length L = 0 … len(ids): a polynomial hash mod 2^61 − 1."""
  out = [0]
  h = 0
  for t in ids:
    h = (h * _BASE + int(t) + 1) % _MOD
    out.append(h)
  return out


@dataclasses.dataclass
class Hit:
  row: int  # the cached row to continue
  length: int  # slots of that row to keep (≤ len(prompt) − 1: at least one token is new)


class PrefixCache:
  """The caches of the last call's rows (`k`, `v`: `[layers, rows, S, kv_heads, head_dim]`)."""

  def __init__(self):
    self.k: Optional[jax.Array] = None
    self.v: Optional[jax.Array] = None
    self._rows: dict[tuple[int, int], int] = {}  # (length, prefix hash) → row
    self._keys: list[tuple[int, ...]] = []
    self._lengths: list[int] = []

  def __len__(self) -> int:
    return len(self._keys)

  def clear(self) -> None:
    self.__init__()

  def store(self, k: jax.Array, v: jax.Array, sequences: Sequence[Sequence[int]]) -> None:
    """Keeps `k`, `v` whose row i holds the keys and values of `sequences[i]`."""
    self.k, self.v = k, v
    self._keys = [tuple(int(t) for t in s) for s in sequences]
    self._rows = {}
    for i, key in enumerate(self._keys):
      if key:  # an empty sequence marks a padding row
        self._rows.setdefault((len(key), prefix_hashes(key)[-1]), i)
    self._lengths = sorted({len(key) for key in self._keys if key}, reverse=True)

  def find(self, prompt: Sequence[int]) -> Optional[Hit]:
    """The stored row holding the longest prefix of `prompt`, or None (then it is prefilled)."""
    if not self._keys:
      return None
    hashes = prefix_hashes(prompt)
    for length in self._lengths:
      if length > len(prompt) or length == 0:
        continue
      row = self._rows.get((length, hashes[length]))
      if row is not None and self._keys[row] == tuple(int(t) for t in prompt[:length]):
        return Hit(row=row, length=min(length, len(prompt) - 1))
    return None
