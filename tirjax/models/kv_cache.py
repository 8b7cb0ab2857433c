"""KV-cache decoding of the `Decoder`: prefill a right-padded prompt batch, then one token per
row per step.

The cache holds every layer's rotated keys and values, `k, v [layers, B, S, kv_heads,
head_dim]` in `config.dtype` (the scanned layer axis first, as the layer parameters), and
`lengths [B]`: row b's tokens occupy slots `0 … lengths[b] − 1`; later slots are garbage that
no query reads.

* `prefill` runs the decoder's layer scan over the prompts once, emitting each layer's keys
  and values, and pads them to S slots. A row's prompt occupies slots `0 … len_b − 1` (its
  right padding writes slots that decoding overwrites before they are read).
* `decode_step` embeds one token per row at position `lengths[b]`, writes its key and value
  into slot `lengths[b]` of each layer (a scatter into the carried cache, so a step writes
  one slot, not a layer), and its query attends slots `0 … lengths[b]`.

Positions are those of the full forward (`cumsum(valid) − 1` on right-padded rows), so the
logits of prefill and decode equal `Decoder.__call__` on the concatenated rows, whatever the
per-row lengths.
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from tirjax.models.decoder import Decoder
from tirjax.models.layers import rope_tables
from tirjax.sharding import constrain

_CACHE_AXES = ("layers", "batch", "length", "kv_heads", "head_dim")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
  """Keys and values `[layers, B, S, kv_heads, head_dim]`; `lengths [B]` filled slots."""

  k: jax.Array
  v: jax.Array
  lengths: jax.Array

  @property
  def size(self) -> int:
    """S, the slots per row: prompt plus generated tokens must fit."""
    return self.k.shape[2]


def prefill(model: Decoder, tokens: jax.Array, lengths: jax.Array, size: int
            ) -> tuple[jax.Array, KVCache]:
  """Runs right-padded prompts through the model and fills a cache of `size` slots.

  Args:
    model: the decoder.
    tokens: `[B, P]` prompt ids, row b valid on its first `lengths[b]` positions (the rest
      may hold any ids).
    lengths: `[B]` int, each in `[1, P]`.
    size: S ≥ P, slots per row; decoding can add `S − lengths[b]` tokens to row b.

  Returns:
    float32 logits `[B, vocab]` at each row's last prompt token (the next token's
    distribution), and the cache with `lengths` filled slots.
  """
  chex.assert_rank(tokens, 2)
  chex.assert_shape(lengths, tokens.shape[:1])
  cfg = model.config
  b, p = tokens.shape
  if size < p:
    raise ValueError(f"size: the cache needs at least the prompt length {p} slots, got {size}")
  lengths = lengths.astype(jnp.int32)
  valid = jnp.arange(p)[None] < lengths[:, None]
  positions = jnp.broadcast_to(jnp.arange(p), (b, p))
  cos, sin = rope_tables(cfg, positions, cfg.dtype)
  mask = jnp.tril(jnp.ones((p, p), bool))[None] & valid[:, None, :]
  x = model.embed_tokens(tokens, valid)
  graphdef, layer_state = nnx.split(model.layers)

  def body(x, state):
    layer = nnx.merge(graphdef, state)
    q, k, v = layer.qkv(x, cos, sin)
    return layer.finish(x, q, k, v, mask), (k, v)

  x, (k, v) = jax.lax.scan(body, x, layer_state)
  last = jnp.take_along_axis(x, (lengths - 1)[:, None, None], axis=1)
  logits = model.logits(model.final_norm(last))[:, 0]
  pad = ((0, 0), (0, 0), (0, size - p), (0, 0), (0, 0))
  k = constrain(jnp.pad(k, pad), _CACHE_AXES, model.rules)
  v = constrain(jnp.pad(v, pad), _CACHE_AXES, model.rules)
  return logits, KVCache(k, v, lengths)


def decode_step(model: Decoder, cache: KVCache, tokens: jax.Array
                ) -> tuple[jax.Array, KVCache]:
  """Appends one token per row: float32 logits `[B, vocab]` of the next token and the cache
  with `lengths + 1`. Every row must have a free slot (`lengths < size`): a token past the
  last slot is not stored."""
  chex.assert_shape(tokens, cache.lengths.shape)
  cfg = model.config
  b, s = tokens.shape[0], cache.size
  pos = cache.lengths
  cos, sin = rope_tables(cfg, pos[:, None], cfg.dtype)
  mask = (jnp.arange(s)[None] <= pos[:, None])[:, None, :]
  x = model.embed_tokens(tokens[:, None], jnp.ones((b, 1), bool))
  graphdef, layer_state = nnx.split(model.layers)
  rows = jnp.arange(b)

  def body(carry, xs):
    x, k_all, v_all = carry
    state, i = xs
    layer = nnx.merge(graphdef, state)
    q, k, v = layer.qkv(x, cos, sin)
    k_all = k_all.at[i, rows, pos].set(k[:, 0])
    v_all = v_all.at[i, rows, pos].set(v[:, 0])
    x = layer.finish(x, q, k_all[i], v_all[i], mask)
    return (x, k_all, v_all), None

  (x, k, v), _ = jax.lax.scan(body, (x, cache.k, cache.v),
                              (layer_state, jnp.arange(cfg.num_layers)))
  logits = model.logits(model.final_norm(x))[:, 0]
  return logits, KVCache(k, v, pos + 1)


def extend(model: Decoder, cache: KVCache, tokens: jax.Array, counts: jax.Array
           ) -> tuple[jax.Array, KVCache]:
  """Appends up to E tokens per row to a filled cache (a prefill that continues a row).

  Row b's `counts[b]` ≥ 1 tokens `tokens[b, :counts[b]]` take positions and slots
  `lengths[b] …` and attend every slot up to their own; the padding beyond `counts[b]` writes
  slots that later tokens overwrite before any query reads them. With an empty cache this is
  a prefill; on a row's cache from an earlier call it computes only the new tokens (the tool
  response of a multi-turn episode), never what the row has already seen.

  Args:
    model: the decoder.
    cache: the rows' caches; row b needs `lengths[b] + counts[b]` ≤ S slots (padding
      tokens past the last slot are not stored).
    tokens: `[B, E]` ids, right-padded.
    counts: `[B]` int in `[1, E]`.

  Returns:
    float32 logits `[B, vocab]` at each row's last new token, and the cache with
    `lengths + counts`.
  """
  chex.assert_rank(tokens, 2)
  chex.assert_shape(counts, cache.lengths.shape)
  cfg = model.config
  b, e = tokens.shape
  s = cache.size
  base = cache.lengths
  counts = counts.astype(jnp.int32)
  positions = base[:, None] + jnp.arange(e)[None]  # [B, E]
  valid = jnp.arange(e)[None] < counts[:, None]
  cos, sin = rope_tables(cfg, positions, cfg.dtype)
  mask = jnp.arange(s)[None, None, :] <= positions[:, :, None]  # [B, E, S]
  x = model.embed_tokens(tokens, valid)
  graphdef, layer_state = nnx.split(model.layers)
  rows = jnp.arange(b)[:, None]

  def body(carry, xs):
    x, k_all, v_all = carry
    state, i = xs
    layer = nnx.merge(graphdef, state)
    q, k, v = layer.qkv(x, cos, sin)
    k_all = k_all.at[i, rows, positions].set(k, mode="drop")
    v_all = v_all.at[i, rows, positions].set(v, mode="drop")
    x = layer.finish(x, q, k_all[i], v_all[i], mask)
    return (x, k_all, v_all), None

  (x, k, v), _ = jax.lax.scan(body, (x, cache.k, cache.v),
                              (layer_state, jnp.arange(cfg.num_layers)))
  last = jnp.take_along_axis(x, (counts - 1)[:, None, None], axis=1)
  logits = model.logits(model.final_norm(last))[:, 0]
  return logits, KVCache(k, v, base + counts)
