"""Attention over packed token forests: every shared prefix computed once, no padding.

A packed sequence `[N]` holds one or more forests (a query group's rows laid out once, see
`tirjax.training.forest`) in depth-first order: a token's ancestors (the tokens before it on
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
`TreeMask.attend` gathers those keys and runs the dense attention on `[S·nq, blk, K]`.
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

  @property
  def block(self) -> int:
    return self.positions.shape[1] // self.key_index.shape[1]

  def blocks(self, x: jax.Array) -> jax.Array:
    """`[S, N, ...]` → `[S·nq, blk, ...]`: the query blocks."""
    s, n = x.shape[:2]
    return x.reshape((s * (n // self.block), self.block) + x.shape[2:])

  def unblock(self, x: jax.Array) -> jax.Array:
    """`[S·nq, blk, ...]` → `[S, N, ...]`."""
    s = self.positions.shape[0]
    return x.reshape((s, -1) + x.shape[2:])

  def gather(self, x: jax.Array) -> jax.Array:
    """`[S, N, ...]` → `[S·nq, K, ...]`: each query block's keys (or values)."""
    out = jax.vmap(lambda xs, idx: xs[idx])(x, self.key_index)  # [S, nq, K, ...]
    return out.reshape((-1,) + out.shape[2:])

  def dense(self) -> jax.Array:
    """`[S·nq, blk, K]` bool: query i of a block reads gathered key j iff j ≤ i ≤ seg_end[j]."""
    s, n = self.positions.shape
    query = self.blocks(jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (s, n)))  # [S·nq, blk]
    key = self.key_index.reshape(-1, self.key_index.shape[-1])  # [S·nq, K]
    end = self.gather(self.seg_end)
    ok = self.key_valid.reshape(key.shape)
    return (ok[:, None, :] & (key[:, None, :] <= query[:, :, None])
            & (query[:, :, None] <= end[:, None, :]))

  def attend(self, attend_dense, q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """`attend_dense(q, k, v, mask)` (e.g. `layers.Attention.attend`) of q `[S, N, heads,
    hd]` over k, v `[S, N, kv_heads, hd]` under this mask, → `[S, N, ...]`."""
    return self.unblock(attend_dense(self.blocks(q), self.gather(k), self.gather(v),
                                     self.dense()))
