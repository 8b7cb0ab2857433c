"""The built-in sampler: jitted, batched, KV-cached decoding of the Flax policy (SPEC §7).

    sampler = JaxSampler(model)                      # a `tirjax.models.Decoder`
    out = sampler.generate(prompts, SamplingParams(n=4, temperature=1.0, max_new_tokens=256,
                                                   stop_token_ids=(im_end,), seed=7))
    sampler.update(new_model_or_state, policy_version=3)   # new weights, no recompilation

One device call per chunk of rows (a row is one sample: prompts × n of them): prefill of the
chunk's distinct right-padded prompts into a KV cache (the n samples of a prompt share one
prefill and copy its cache rows), then a `lax.while_loop` that emits one token per row per
iteration and exits early once every row has stopped. A row stops at its first stop token
(kept as its last token) or at `max_new_tokens`; a stopped row idles (its outputs are no
longer written) until the loop ends.

Buckets: shapes are rounded up so that each executable serves many calls. For a chunk of R
rows (at most `max_batch`) from Q distinct prompts, longest prompt P, `max_new_tokens` N:

  rows     2^⌈log2 R⌉, at least `min_batch`
  prompts  2^⌈log2 Q⌉, at least `min_batch`, at most the rows bucket
  prompt   2^⌈log2 P⌉, at least `min_prompt_len`
  new      2^⌈log2 N⌉, at least `min_new_tokens`   (cache slots: prompt + new)

plus whether top log-probs are returned (`max_top_logprobs` of them, cut to the request).
Temperature, top-p, `max_new_tokens`, the stop ids and the seed are traced values. Each
bucket is compiled once, ahead of time (`jit(...).lower(...).compile()`); `compiled_buckets`
lists them.

Randomness: a call with `params.seed = s` uses key(s), folded with the chunk index and the
step index: a pure function of the seed, so a seed reproduces a batch (also after a restart
of the trainer, which makes resumed runs identical to uninterrupted ones). Callers that want
fresh samples pass fresh seeds, as the rollout modes do (one drawn per call).

Reported per token: log p under the raw model (temperature 1, no top-p: the trainer's
`token_logprobs` of the same weights), the entropy of that distribution (ARPO), and with
`top_logprobs > 0` the most likely tokens' log-probs.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import NamedTuple, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tirjax.models.decoder import Decoder
from tirjax.models.kv_cache import KVCache, decode_step, extend, prefill
from tirjax.sampling.choice import choose, raw_stats
from tirjax.sampling.interface import Sample, SamplingParams
from tirjax.sampling.prefix_cache import PrefixCache


def bucket(size: int, minimum: int) -> int:
  """The smallest power of two ≥ size, at least `minimum`."""
  return max(minimum, 1 << max(size - 1, 0).bit_length())


@dataclasses.dataclass(frozen=True)
class JaxSamplerOptions:
  """Shape buckets and limits of the built-in sampler.

  Attributes:
    min_batch: smallest row bucket (a power of two).
    min_prompts: smallest bucket of distinct prompts (a power of two; None: `min_batch`). The
      n samples of a prompt share its prefill, so a call of 4 prompts × 16 samples prefills a
      bucket of 4 prompts, not of 64.
    max_batch: most rows per device call (a power of two); more rows run as several calls.
    min_prompt_len: smallest prompt-length bucket (a power of two).
    min_new_tokens: smallest new-token bucket (a power of two).
    max_stop_tokens: stop ids per request (a traced array of this size).
    max_top_logprobs: top log-probs computed when a request asks for any (`top_k` is static).
    reuse_cache: keep each call's KV caches and continue the rows of the next call that
      extend them (`prefix_cache`); False prefills every prompt whole (the old path).
    min_suffix_len: smallest bucket of new prompt tokens on a continued row (a power of two).
  """

  min_batch: int = 8
  min_prompts: Optional[int] = None
  max_batch: int = 256
  min_prompt_len: int = 64
  min_new_tokens: int = 16
  max_stop_tokens: int = 8
  max_top_logprobs: int = 20
  reuse_cache: bool = True
  min_suffix_len: int = 16

  def __post_init__(self):
    for name in ("min_batch", "max_batch", "min_prompt_len", "min_new_tokens", "min_suffix_len"):
      value = getattr(self, name)
      if value < 1 or value & (value - 1):
        raise ValueError(f"{name}: must be a power of two, got {value}")
    if self.min_prompts is not None and (self.min_prompts < 1
                                         or self.min_prompts & (self.min_prompts - 1)):
      raise ValueError(f"min_prompts: must be None or a power of two, got {self.min_prompts}")
    if self.max_batch < self.min_batch:
      raise ValueError(f"max_batch: must be >= min_batch={self.min_batch}, got "
                       f"{self.max_batch}")
    for name in ("max_stop_tokens", "max_top_logprobs"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")


class Bucket(NamedTuple):
  """The shapes of a call that prefills its prompts (and of its decode loop)."""

  rows: int
  prompts: int
  prompt_len: int
  new_tokens: int
  top_k: int  # 0: no top log-probs


class ContinueBucket(NamedTuple):
  """The shapes of a call that continues cached rows: `suffix_len` new prompt tokens per
  distinct prompt on top of a cache of `cache_len` slots, gathered from `stored_rows` rows of
  `stored_len` slots."""

  rows: int
  prompts: int
  suffix_len: int
  cache_len: int
  stored_rows: int
  stored_len: int
  new_tokens: int
  top_k: int


class _Loop(NamedTuple):
  """The decode loop's carry: step t, cache, last tokens and the `[B, N]` outputs."""

  t: jax.Array
  cache: KVCache
  last: jax.Array
  done: jax.Array
  count: jax.Array
  stopped: jax.Array
  tokens: jax.Array
  logprobs: jax.Array
  entropies: jax.Array
  top_ids: jax.Array
  top_logprobs: jax.Array


def _prefill(graphdef, size: int, state, prompts, lengths):
  """Prefill of `[Q, P]` right-padded prompts into a cache of `size` slots."""
  return prefill(nnx.merge(graphdef, state), prompts, lengths, size)


def _continue(graphdef, size: int, state, stored_k, stored_v, src, base, suffix, counts):
  """Rows `src` of the stored caches, their first `base` slots kept, extended by `suffix`."""
  k, v = stored_k[:, src], stored_v[:, src]
  have = k.shape[2]
  if have < size:
    pad = ((0, 0), (0, 0), (0, size - have), (0, 0), (0, 0))
    k, v = jnp.pad(k, pad), jnp.pad(v, pad)
  cache = KVCache(k[:, :, :size], v[:, :, :size], base.astype(jnp.int32))
  return extend(nnx.merge(graphdef, state), cache, suffix, counts)


def _decode(graphdef, new_tokens: int, top_k: int, state, logits, cache, source, live, key,
            temperature, top_p, max_new, stop_ids) -> dict:
  """The decode loop over `[B]` rows from the next-token logits and caches of `[Q]` prompts;
  row b extends prompt `source[b]`, and is padding unless `live[b]`. Returns the outputs and
  the rows' final caches (`k`, `v`)."""
  model = nnx.merge(graphdef, state)
  b = source.shape[0]
  logits = logits[source]
  cache = KVCache(cache.k[:, source], cache.v[:, source], cache.lengths[source])

  def emit(s: _Loop, logits) -> _Loop:
    tok = choose(jax.random.fold_in(key, s.t), logits, temperature, top_p)
    logp, entropy, logp_all = raw_stats(logits, tok)
    on = ~s.done

    def put(buf, x):  # column t of a [B, N, ...] output, written for rows still going
      return buf.at[:, s.t].set(jnp.where(on.reshape((b,) + (1,) * (x.ndim - 1)), x,
                                          buf[:, s.t]))

    if top_k:
      top_lp, top_id = jax.lax.top_k(logp_all, top_k)
      s = s._replace(top_ids=put(s.top_ids, top_id), top_logprobs=put(s.top_logprobs, top_lp))
    stop = on & jnp.any(tok[:, None] == stop_ids[None], axis=-1)
    count = s.count + on
    return s._replace(
        t=s.t + 1, last=tok, count=count, stopped=s.stopped | stop,
        done=s.done | stop | (count >= max_new), tokens=put(s.tokens, tok),
        logprobs=put(s.logprobs, logp), entropies=put(s.entropies, entropy))

  def body(s: _Loop) -> _Loop:
    logits, cache = decode_step(model, s.cache, s.last)
    return emit(s._replace(cache=cache), logits)

  def more(s: _Loop):
    return (s.t < max_new) & ~jnp.all(s.done)

  n, k = new_tokens, max(top_k, 1)  # top: a [B, N, 1] placeholder when none is asked for
  i32, f32 = jnp.int32, jnp.float32
  s = _Loop(t=jnp.int32(0), cache=cache, last=jnp.zeros(b, i32), done=~live,
            count=jnp.zeros(b, i32), stopped=jnp.zeros(b, bool), tokens=jnp.zeros((b, n), i32),
            logprobs=jnp.zeros((b, n), f32), entropies=jnp.zeros((b, n), f32),
            top_ids=jnp.zeros((b, n, k), i32), top_logprobs=jnp.zeros((b, n, k), f32))
  s = jax.lax.while_loop(more, body, emit(s, logits))
  out = dict(tokens=s.tokens, logprobs=s.logprobs, entropies=s.entropies, count=s.count,
             stopped=s.stopped, k=s.cache.k, v=s.cache.v)
  if top_k:
    out.update(top_ids=s.top_ids, top_logprobs=s.top_logprobs)
  return out


class JaxSampler:
  """`Sampler` (tirjax.sampling.interface) over a `Decoder` with bucketed, compiled shapes.

  The sampler holds the given parameter arrays (no copy): a trainer that donates its
  parameter buffers must hand over copies. `counters` add up, over calls: prompt tokens
  computed (`prefill_tokens`, only the new ones on continued rows) and their seconds,
  sampled tokens and the decode loop's seconds (each phase waited on), and rows continued
  from the prefix cache or prefilled.
  """

  def __init__(self, model: Decoder, options: JaxSamplerOptions = JaxSamplerOptions(),
               policy_version: int = 0):
    self.options = options
    self.config = model.config
    self.graphdef, self._state = nnx.split(model)
    self.vocab_size = model.config.vocab_size
    self.policy_version = int(policy_version)
    self._compiled: dict[Bucket, object] = {}
    self._continued: dict[ContinueBucket, object] = {}
    self._decoders: dict[tuple, object] = {}  # (rows, prompts, slots, new, top_k) → decode loop
    self._pool_rows = 0  # rows of the stored caches: the largest row bucket so far
    self._cache = PrefixCache()
    self.counters = dict(calls=0, prefill_tokens=0, prefill_s=0.0, decode_tokens=0,
                         decode_s=0.0, continued_rows=0, prefilled_rows=0)

  @property
  def compiled_buckets(self) -> tuple[Bucket, ...]:
    """The buckets of prefilling calls compiled so far, in order: one prefill and one decode
    executable each."""
    return tuple(self._compiled)

  @property
  def continue_buckets(self) -> tuple[ContinueBucket, ...]:
    """The buckets of calls that continued cached rows, compiled so far."""
    return tuple(self._continued)

  def update(self, model_or_state: Union[Decoder, nnx.State], policy_version: int) -> None:
    """New weights (same structure, shapes and dtypes) and their version; no recompilation.
    The prefix cache, computed with the old weights, is dropped.

    A model must have the sampler's configuration (its graph is compiled in); a state is
    taken as parameters of that configuration."""
    state = model_or_state
    if isinstance(model_or_state, nnx.Module):
      graphdef, state = nnx.split(model_or_state)
      if graphdef != self.graphdef:
        mine = dataclasses.asdict(self.config)
        theirs = dataclasses.asdict(model_or_state.config)
        raise ValueError("update: the model's configuration differs from the sampler's: " +
                         ", ".join(f"{k}={v!r} (sampler: {mine[k]!r})"
                                   for k, v in theirs.items() if mine[k] != v))
    old, new = jax.tree.leaves_with_path(self._state), jax.tree.leaves_with_path(state)
    if jax.tree.structure(self._state) != jax.tree.structure(state):
      raise ValueError("update: the new state's parameters differ from the sampler's "
                       f"(structure {jax.tree.structure(state)} vs "
                       f"{jax.tree.structure(self._state)})")
    for (path, a), (_, b) in zip(old, new):
      if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"update: parameter {jax.tree_util.keystr(path)} is "
                         f"{b.dtype}{list(b.shape)}, the sampler's is {a.dtype}{list(a.shape)}")
    self._state = jax.tree.map(lambda a, b: jax.device_put(b, a.sharding), self._state, state)
    self.policy_version = int(policy_version)
    self._cache.clear()

  def generate(self, prompts: Sequence[Sequence[int]],
               params: SamplingParams) -> list[list[Sample]]:
    """For each prompt, `params.n` samples (see the module docstring)."""
    o = self.options
    self._check(prompts, params)
    if len(params.stop_token_ids) > o.max_stop_tokens:
      raise ValueError(f"stop_token_ids: {len(params.stop_token_ids)} ids exceed "
                       f"options.max_stop_tokens={o.max_stop_tokens}")
    if params.top_logprobs > o.max_top_logprobs:
      raise ValueError(f"top_logprobs: {params.top_logprobs} exceeds "
                       f"options.max_top_logprobs={o.max_top_logprobs}")
    key = jax.random.key(params.seed)
    rows = [i for i in range(len(prompts)) for _ in range(params.n)]  # row → prompt
    samples, kept = [], []
    for c, start in enumerate(range(0, len(rows), o.max_batch)):
      chunk, cache = self._chunk(prompts, rows[start:start + o.max_batch], params,
                                 jax.random.fold_in(key, c))
      samples += chunk
      kept.append(cache)
    self.counters["calls"] += 1
    if o.reuse_cache and kept:
      self._keep(kept)
    return [samples[i * params.n:(i + 1) * params.n] for i in range(len(prompts))]

  def _keep(self, kept) -> None:
    """Stores the call's caches: each row under its prompt and sampled tokens but the last."""
    size = max(k.shape[2] for k, _, _ in kept)
    pad = lambda x: jnp.pad(x, ((0, 0), (0, 0), (0, size - x.shape[2]), (0, 0), (0, 0)))
    ks, vs, seqs = [], [], []
    for k, v, sequences in kept:  # whole row buckets: stored shapes stay few (no recompiles)
      ks.append(pad(k))
      vs.append(pad(v))
      seqs += list(sequences) + [[]] * (k.shape[1] - len(sequences))
    k, v = (ks[0], vs[0]) if len(ks) == 1 else (jnp.concatenate(ks, 1), jnp.concatenate(vs, 1))
    # One pool size (the largest so far) for every store: the continuing executables are
    # compiled for it once, whatever the rows of the last call.
    self._pool_rows = max(self._pool_rows, k.shape[1])
    extra = ((0, 0), (0, self._pool_rows - k.shape[1]), (0, 0), (0, 0), (0, 0))
    k, v = jnp.pad(k, extra), jnp.pad(v, extra)
    self._cache.store(k, v, seqs)

  def _check(self, prompts, params):
    for i, p in enumerate(prompts):
      if not len(p):
        raise ValueError(f"prompts[{i}]: empty; a prompt needs at least one token")
      if min(p) < 0 or max(p) >= self.vocab_size:
        raise ValueError(f"prompts[{i}]: token ids must lie in [0, {self.vocab_size}), got "
                         f"[{min(p)}, {max(p)}]")
    stops = params.stop_token_ids
    if stops and (min(stops) < 0 or max(stops) >= self.vocab_size):
      raise ValueError(f"stop_token_ids: must lie in [0, {self.vocab_size}), got {stops}")

  def bucket_for(self, rows: int, prompt_len: int, max_new_tokens: int, top_logprobs: int = 0,
                 prompts: Optional[int] = None) -> Bucket:
    """The bucket of a device call of `rows` rows (at most `max_batch` are one call) from
    `prompts` distinct prompts (default: one per row), the longest of `prompt_len` tokens."""
    o = self.options
    rows = min(rows, o.max_batch)
    prompts = rows if prompts is None else min(prompts, rows)
    min_prompts = o.min_batch if o.min_prompts is None else o.min_prompts
    return Bucket(rows=bucket(rows, o.min_batch), prompts=bucket(prompts, min_prompts),
                  prompt_len=bucket(prompt_len, o.min_prompt_len),
                  new_tokens=bucket(max_new_tokens, o.min_new_tokens),
                  top_k=o.max_top_logprobs if top_logprobs else 0)

  def precompile(self, rows: int, prompt_len: int, max_new_tokens: int, top_logprobs: int = 0,
                 prompts: Optional[int] = None) -> Bucket:
    """Compiles the bucket of such calls now (a no-op if it exists), so that timed or
    latency-bound calls do not; returns the bucket."""
    b = self.bucket_for(rows, prompt_len, max_new_tokens, top_logprobs, prompts)
    self._executable(b)
    return b

  def _decoder_exec(self, rows: int, prompts: int, size: int, new_tokens: int, top_k: int):
    """The decode loop's executable, shared by prefilling and continuing calls."""
    key = (rows, prompts, size, new_tokens, top_k)
    if key not in self._decoders:
      self._decoders[key] = self._compile_decoder(*key)
    return self._decoders[key]

  def _compile_decoder(self, rows: int, prompts: int, size: int, new_tokens: int, top_k: int):
    o, i32, f32 = self.options, jnp.int32, jnp.float32
    spec = jax.ShapeDtypeStruct
    c = self.config
    kv = spec((c.num_layers, prompts, size, c.num_kv_heads, c.head_dim), c.dtype)
    cache = KVCache(kv, kv, spec((prompts,), i32))
    fn = jax.jit(functools.partial(_decode, self.graphdef, new_tokens, top_k))
    return fn.lower(self._state, spec((prompts, self.vocab_size), f32), cache, spec((rows,), i32),
                    spec((rows,), bool), jax.random.key(0), spec((), f32), spec((), f32),
                    spec((), i32), spec((o.max_stop_tokens,), i32)).compile()

  def _executable(self, b: Bucket):
    """(prefill, decode) executables of a prefilling call."""
    if b not in self._compiled:
      spec, i32 = jax.ShapeDtypeStruct, jnp.int32
      size = b.prompt_len + b.new_tokens
      pre = jax.jit(functools.partial(_prefill, self.graphdef, size)).lower(
          self._state, spec((b.prompts, b.prompt_len), i32), spec((b.prompts,), i32)).compile()
      self._compiled[b] = (pre, self._decoder_exec(b.rows, b.prompts, size, b.new_tokens,
                                                   b.top_k))
    return self._compiled[b]

  def _continue_exec(self, b: ContinueBucket):
    """(extend, decode) executables of a call that continues cached rows."""
    if b not in self._continued:
      spec, i32, c = jax.ShapeDtypeStruct, jnp.int32, self.config
      stored = spec((c.num_layers, b.stored_rows, b.stored_len, c.num_kv_heads, c.head_dim),
                    c.dtype)
      ext = jax.jit(functools.partial(_continue, self.graphdef, b.cache_len)).lower(
          self._state, stored, stored, spec((b.prompts,), i32), spec((b.prompts,), i32),
          spec((b.prompts, b.suffix_len), i32), spec((b.prompts,), i32)).compile()
      self._continued[b] = (ext, self._decoder_exec(b.rows, b.prompts, b.cache_len,
                                                    b.new_tokens, b.top_k))
    return self._continued[b]

  def _chunk(self, prompts: Sequence[Sequence[int]], rows: list[int], params: SamplingParams,
             key):
    """Samples of `rows` (prompt indices, at most `max_batch`) in one prefill (or extend) and
    one decode call; also returns (k, v, sequences) of the rows' caches for the next call."""
    o = self.options
    distinct = list(dict.fromkeys(rows))
    b = self.bucket_for(len(rows), max(len(prompts[p]) for p in distinct),
                        params.max_new_tokens, params.top_logprobs, len(distinct))
    hits = [self._cache.find(prompts[p]) for p in distinct] if o.reuse_cache else []
    t0 = time.perf_counter()
    if hits and all(h is not None for h in hits):
      suffix_len = bucket(max(len(prompts[p]) - h.length for p, h in zip(distinct, hits)),
                          o.min_suffix_len)
      # Continued rows rarely share a context (tree siblings do): prompts get the rows' bucket.
      b = b._replace(prompts=b.rows)
      cb = ContinueBucket(rows=b.rows, prompts=b.prompts, suffix_len=suffix_len,
                          cache_len=b.prompt_len + b.new_tokens,
                          stored_rows=self._cache.k.shape[1], stored_len=self._cache.k.shape[2],
                          new_tokens=b.new_tokens, top_k=b.top_k)
      ext, dec = self._continue_exec(cb)
      src, base = np.zeros(b.prompts, np.int32), np.zeros(b.prompts, np.int32)
      suffix, counts = np.zeros((b.prompts, suffix_len), np.int32), np.ones(b.prompts, np.int32)
      for j, (p, h) in enumerate(zip(distinct, hits)):
        new = prompts[p][h.length:]
        src[j], base[j], counts[j] = h.row, h.length, len(new)
        suffix[j, :len(new)] = new
      logits, cache = ext(self._state, self._cache.k, self._cache.v, src, base, suffix, counts)
      self.counters["prefill_tokens"] += int(counts[:len(distinct)].sum())
      self.counters["continued_rows"] += len(distinct)
    else:
      pre, dec = self._executable(b)
      tokens = np.zeros((b.prompts, b.prompt_len), np.int32)
      lengths = np.ones(b.prompts, np.int32)  # padding prompts: one token
      for j, p in enumerate(distinct):
        tokens[j, :len(prompts[p])] = prompts[p]
        lengths[j] = len(prompts[p])
      logits, cache = pre(self._state, tokens, lengths)
      self.counters["prefill_tokens"] += int(lengths[:len(distinct)].sum())
      self.counters["prefilled_rows"] += len(distinct)
    jax.block_until_ready(logits)
    t1 = time.perf_counter()
    slot = {p: j for j, p in enumerate(distinct)}
    source = np.zeros(b.rows, np.int32)
    source[:len(rows)] = [slot[p] for p in rows]
    live = np.arange(b.rows) < len(rows)  # padding rows are done from the start
    stops = np.full(o.max_stop_tokens, -1, np.int32)
    stops[:len(params.stop_token_ids)] = params.stop_token_ids
    out = dec(self._state, logits, cache, source, live, key, np.float32(params.temperature),
              np.float32(params.top_p), np.int32(params.max_new_tokens), stops)
    k, v = out.pop("k"), out.pop("v")
    out = jax.device_get(out)
    self.counters["prefill_s"] += t1 - t0
    self.counters["decode_s"] += time.perf_counter() - t1
    samples = [self._sample(out, i, params.top_logprobs) for i in range(len(rows))]
    self.counters["decode_tokens"] += sum(len(s.tokens) for s in samples)
    # Cached: the prompt and every sampled token but the last (never fed back).
    sequences = [list(prompts[p]) + s.tokens[:-1] for p, s in zip(rows, samples)]
    return samples, (k, v, sequences)

  def _sample(self, out: dict, i: int, top_logprobs: int) -> Sample:
    n = int(out["count"][i])
    top = None
    if top_logprobs:
      ids, lps = out["top_ids"][i, :n, :top_logprobs], out["top_logprobs"][i, :n, :top_logprobs]
      top = [dict(zip(a.tolist(), b.tolist())) for a, b in zip(ids, lps)]
    return Sample(tokens=out["tokens"][i, :n].tolist(), logprobs=out["logprobs"][i, :n].tolist(),
                  finish_reason="stop" if out["stopped"][i] else "length",
                  policy_version=self.policy_version,
                  entropies=out["entropies"][i, :n].tolist(), top_logprobs=top)
