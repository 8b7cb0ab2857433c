"""The JAX sampler's device functions: prefill or continue a cache, then decode in segments.

Decoding runs as a short `lax.while_loop` segment per call from the host, so that the host can
move the rows still going into a smaller row bucket between segments (`compact_rows`): a stopped
row then costs nothing, while one decode step's cost grows with the rows it carries (it reads
every row's whole cache). Each function is compiled once per shape by the sampler.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from tirjax.models.kv_cache import KVCache, decode_step, extend, prefill
from tirjax.sampling.choice import choose, raw_stats


class Loop(NamedTuple):
  """The decode carry: step t (the output column, shared by the rows), caches, last tokens
  and the `[B, N]` outputs."""

  t: jax.Array
  cache: KVCache
  row: jax.Array  # each bucket row's random stream (kept when the row changes bucket)
  last: jax.Array
  done: jax.Array
  count: jax.Array
  stopped: jax.Array
  tokens: jax.Array
  logprobs: jax.Array
  entropies: jax.Array
  top_ids: jax.Array
  top_logprobs: jax.Array


class Draw(NamedTuple):
  """What a token draw needs, traced (changing it never recompiles)."""

  key: jax.Array
  temperature: jax.Array
  top_p: jax.Array
  max_new: jax.Array
  stop_ids: jax.Array
  logprob_scale: jax.Array  # 1 / `SamplingParams.logprob_temperature`


def prefill_prompts(graphdef, size: int, state, prompts, lengths):
  """Prefill of `[Q, P]` right-padded prompts into a cache of `size` slots."""
  return prefill(nnx.merge(graphdef, state), prompts, lengths, size)


def continue_rows(graphdef, size: int, state, stored_k, stored_v, src, base, suffix, counts):
  """Rows `src` of the stored caches, their first `base` slots kept, extended by `suffix`."""
  k, v = stored_k[:, src], stored_v[:, src]
  have = k.shape[2]
  if have < size:
    pad = ((0, 0), (0, 0), (0, size - have), (0, 0), (0, 0))
    k, v = jnp.pad(k, pad), jnp.pad(v, pad)
  cache = KVCache(k[:, :, :size], v[:, :, :size], base.astype(jnp.int32))
  return extend(nnx.merge(graphdef, state), cache, suffix, counts)


def _emit(s: Loop, logits, draw: Draw, top_k: int) -> Loop:
  b = s.last.shape[0]
  keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(jax.random.fold_in(draw.key, s.t),
                                                         s.row)
  tok = jax.vmap(choose, in_axes=(0, 0, None, None))(keys, logits[:, None], draw.temperature,
                                                     draw.top_p)[:, 0]
  logp, entropy, logp_all = raw_stats(logits, tok)
  # the tempered policy's log-prob where asked for; at scale 1 the raw one, bit for bit
  tempered = jnp.take_along_axis(jax.nn.log_softmax(logits * draw.logprob_scale, axis=-1),
                                 tok[:, None], axis=-1)[:, 0]
  logp = jnp.where(draw.logprob_scale == 1, logp, tempered)
  on = ~s.done

  def put(buf, x):  # column t of a [B, N, ...] output, written for rows still going
    return buf.at[:, s.t].set(jnp.where(on.reshape((b,) + (1,) * (x.ndim - 1)), x,
                                        buf[:, s.t]), mode="drop")

  if top_k:
    top_lp, top_id = jax.lax.top_k(logp_all, top_k)
    s = s._replace(top_ids=put(s.top_ids, top_id), top_logprobs=put(s.top_logprobs, top_lp))
  stop = on & jnp.any(tok[:, None] == draw.stop_ids[None], axis=-1)
  count = s.count + on
  return s._replace(
      t=s.t + 1, last=tok, count=count, stopped=s.stopped | stop,
      done=s.done | stop | (count >= draw.max_new), tokens=put(s.tokens, tok),
      logprobs=put(s.logprobs, logp), entropies=put(s.entropies, entropy))


def start(new_tokens: int, top_k: int, logits, cache: KVCache, source, live, stream,
          draw: Draw) -> Loop:
  """The carry of `[B]` rows from the next-token logits and caches of `[Q]` prompts (row b
  extends prompt `source[b]`, draws from random stream `stream[b]`, and is padding unless
  `live[b]`), their first tokens drawn."""
  b = source.shape[0]
  cache = KVCache(cache.k[:, source], cache.v[:, source], cache.lengths[source])
  n, k = new_tokens, max(top_k, 1)  # top: a [B, N, 1] placeholder when none is asked for
  i32, f32 = jnp.int32, jnp.float32
  s = Loop(t=jnp.int32(0), cache=cache, row=stream.astype(i32), last=jnp.zeros(b, i32),
           done=~live,
           count=jnp.zeros(b, i32), stopped=jnp.zeros(b, bool), tokens=jnp.zeros((b, n), i32),
           logprobs=jnp.zeros((b, n), f32), entropies=jnp.zeros((b, n), f32),
           top_ids=jnp.zeros((b, n, k), i32), top_logprobs=jnp.zeros((b, n, k), f32))
  return _emit(s, logits[source], draw, top_k)


def segment(graphdef, steps: int, top_k: int, state, s: Loop, draw: Draw) -> Loop:
  """Up to `steps` decode steps, fewer once every row is done or at `max_new`."""
  model = nnx.merge(graphdef, state)
  end = s.t + steps

  def body(s: Loop) -> Loop:
    logits, cache = decode_step(model, s.cache, s.last)
    return _emit(s._replace(cache=cache), logits, draw, top_k)

  def more(s: Loop):
    return (s.t < end) & (s.t < draw.max_new) & ~jnp.all(s.done)

  return jax.lax.while_loop(more, body, s)


def compact_rows(s: Loop, idx, keep) -> Loop:
  """The rows `idx` of the carry (a smaller bucket); rows where `keep` is False are padding."""
  cache = KVCache(s.cache.k[:, idx], s.cache.v[:, idx], s.cache.lengths[idx])
  per_row = {f: getattr(s, f)[idx] for f in Loop._fields if f not in ("t", "cache")}
  return Loop(t=s.t, cache=cache, **{**per_row, "done": per_row["done"] | ~keep})
