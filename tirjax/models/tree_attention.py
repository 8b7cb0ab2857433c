"""Attention over packed token forests: every shared prefix computed once, no padding.

A packed sequence `[N]` holds one or more forests (a query group's rows laid out once, see
`tirjax.train_steps.forest`) in depth-first order: a token's ancestors (the tokens before it on
its root-to-token path) all lie before it, and the tokens below it (its subtree) form the
contiguous range `[i, seg_end[i]]`. So query i may read key j iff

    j ≤ i ≤ seg_end[j]                                    (j is i or an ancestor of i),

which is causal attention along each path, a tree mask where rows branch, and block-diagonal
across the forests packed together (a forest's `seg_end` never passes its last token).
Positions are depths along the path, so a row's tokens get the positions they have in its
own padded row, and RoPE and attention give each token the hidden state of the padded path.

The mask is evaluated blockwise, so the cost is not O(N²): query block b (tokens
`[b·blk, (b+1)·blk)`) reads only the keys `key_index[b]`, the ancestors of its first token
and the block itself, which hold every ancestor of every token in the block (depth-first
order: a later row of the block shares only a prefix of an earlier one's path). That is at
most (longest path + blk) keys, so a block costs blk × (path + blk) like a padded row, but
each packed token is one query, where the padded path has one per row that carries it.
`TreeMask.attend` gathers those keys and runs the dense attention on `[blocks, blk, K]`, a
chunk of query blocks at a time.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass(frozen=True)
class TreeMask:
  """Where each packed token sits and what it attends to; sequences `[S, N]` of
  `N = nq · blk` tokens.

  Attributes:
    positions: [S, N] int32, the token's depth on its path (its position in its padded row).
    seg_end: [S, N] int32, the last packed index of the token's subtree; -1 on padding.
    valid: [S, N] bool, real tokens (padding follows the packed forests).
    key_index: [S, nq, K] int32, the keys query block b may read (ascending; 0 past the end).
    key_valid: [S, nq, K] bool, which entries of `key_index` are keys (not padding).
  """

  positions: jax.Array
  seg_end: jax.Array
  valid: jax.Array
  key_index: jax.Array
  key_valid: jax.Array

  def attend(self, attend_dense, q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """`attend_dense(q, k, v, mask)` (e.g. `layers.Attention.attend`) of q `[S, N, heads,
    hd]` over k, v `[S, N, kv_heads, hd]` under this mask, → `[S, N, ...]`.

    The query blocks of every sequence run `chunk` at a time, each chunk gathering its own
    keys (within its sequence: no data crosses the batch shards) and rematerialised in the
    backward pass, so memory holds one chunk's scores and keys, not N × K of them."""
    s, n = self.positions.shape
    nq, kk = self.key_index.shape[1:]
    blk = n // nq
    to_blocks = lambda x: x.reshape((s, nq, blk) + x.shape[2:])
    queries = to_blocks(jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (s, n)))

    def chunk_out(args):  # [S, c, ...] → [S, c, blk, D]
      qb, query, key, ok = args
      c = key.shape[1]
      take = jax.vmap(lambda x, i: x[i])  # per sequence
      end = take(self.seg_end, key)
      mask = (ok[:, :, None, :] & (key[:, :, None, :] <= query[..., None])
              & (query[..., None] <= end[:, :, None, :]))  # j ≤ i ≤ seg_end[j]
      merge = lambda x: x.reshape((s * c,) + x.shape[2:])
      out = attend_dense(merge(qb), merge(take(k, key)), merge(take(v, key)), merge(mask))
      return out.reshape((s, c) + out.shape[1:])

    args = (to_blocks(q), queries, self.key_index, self.key_valid)
    chunk = _chunk_blocks(nq, s * blk * kk * q.shape[2])
    if chunk == nq:
      out = chunk_out(args)
    else:  # [S, nq, ...] → [nq / c, S, c, ...], mapped over the first axis
      split = lambda x: jnp.moveaxis(x.reshape((s, nq // chunk, chunk) + x.shape[2:]), 1, 0)
      out = jax.lax.map(jax.checkpoint(chunk_out), jax.tree.map(split, args))
      out = jnp.moveaxis(out, 0, 1)
    return out.reshape((s, n) + out.shape[-1:])


# Attention scores (query × key × head) one chunk of query blocks may hold: 2^24 float32, 64 MiB.
_SCORES_PER_CHUNK = 1 << 24


def _chunk_blocks(blocks: int, scores_per_block: int) -> int:
  """Query blocks per chunk: all of a sequence's if their scores fit `_SCORES_PER_CHUNK`,
  else the largest power of two that divides `blocks` and fits (at least one block)."""
  if blocks * scores_per_block <= _SCORES_PER_CHUNK:
    return blocks
  chunk = 1
  while blocks % (chunk * 2) == 0 and chunk * 2 * scores_per_block <= _SCORES_PER_CHUNK:
    chunk *= 2
  return chunk
