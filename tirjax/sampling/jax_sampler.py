"""The built-in sampler: jitted, batched, KV-cached decoding of the Flax policy (spec §7).

    sampler = JaxSampler(model)                      # a `tirjax.models.Decoder`
    out = sampler.generate(prompts, SamplingParams(n=4, temperature=1.0, max_new_tokens=256,
                                                   stop_token_ids=(im_end,), seed=7))
    sampler.update(new_model_or_state, policy_version=3)   # new weights, no recompilation

Per chunk of rows (a row is one sample: prompts × n of them), waited on phase by phase:

1. the prompts' KV caches: a prefill of the chunk's distinct right-padded prompts (the n
   samples of a prompt share one prefill and copy its cache rows), or, when every prompt
   extends a row of the previous call, that row's cache continued by the new tokens only
   (`prefix_cache`, `kv_cache.extend`; `reuse_cache=False` always prefills);
2. decoding in segments of `decode_segment` steps (`jax_decode`): one token per row per step;
   a row stops at its first stop token (kept as its last token) or at `max_new_tokens`; once
   the rows still going fit in half the row bucket they move into a smaller one, so stopped
   rows cost nothing (a step reads every row's whole cache).

Buckets: shapes are rounded up so that each executable serves many calls. For a chunk of R
rows (at most `max_batch`) from Q distinct prompts, longest prompt P, `max_new_tokens` N:

  rows     2^⌈log2 R⌉, at least `min_batch`
  prompts  2^⌈log2 Q⌉, at least `min_prompts` (default `min_batch`), at most the rows bucket
  prompt   2^⌈log2 P⌉, at least `min_prompt_len`
  new      2^⌈log2 N⌉, at least `min_new_tokens`   (cache slots: prompt + new)

plus whether top log-probs are returned (`max_top_logprobs` of them, cut to the request); a
continuing call adds its new-token bucket (at least `min_suffix_len`) and the stored pool's
shape (`continue_buckets`). Temperature, top-p, `max_new_tokens`, the stop ids and the seed
are traced values. Each executable is compiled once, ahead of time
(`jit(...).lower(...).compile()`); `compiled_buckets` lists the prefilling calls' buckets.

Randomness: a call with `params.seed = s` uses key(s), folded with the chunk index, the step
index and the row's index in the chunk: a pure function of the seed, whatever bucket a row is
decoded in, so a seed reproduces a batch (also after a restart of the trainer, which makes
resumed runs identical to uninterrupted ones). With `params.row_ids`, sample j of prompt i
draws from stream `row_ids[i] * n + j` instead (chunk index 0): its tokens then depend on the
seed and its id only, not on which other prompts share the call, which is what lets each
process of a multi-process run sample its own share of a batch and get the rows a single
process would. Callers that want fresh samples pass fresh seeds, as the rollout modes do (one
drawn per call).

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

from tirjax import option_checks
from tirjax.models.decoder import Decoder
from tirjax.models.kv_cache import KVCache
from tirjax.sampling import jax_decode
from tirjax.sampling.jax_decode import Draw
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
    decode_segment: decode steps between the host's looks at the rows still going.
    min_decode_rows: the smallest row bucket the rows still going are moved into (a power of
      two); they move once they fit in half the current bucket. `max_batch`: never.
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
  decode_segment: int = 8
  min_decode_rows: int = 8

  def __post_init__(self):
    for name in ("min_batch", "max_batch", "min_prompt_len", "min_new_tokens", "min_suffix_len",
                 "min_decode_rows"):
      value = getattr(self, name)
      if value < 1 or value & (value - 1):
        raise ValueError(f"{name}: must be a power of two, got {value}")
    if self.min_prompts is not None and (self.min_prompts < 1
                                         or self.min_prompts & (self.min_prompts - 1)):
      raise ValueError(f"min_prompts: must be None or a power of two, got {self.min_prompts}")
    if self.max_batch < self.min_batch:
      raise ValueError(f"max_batch: must be >= min_batch={self.min_batch}, got "
                       f"{self.max_batch}")
    for name in ("max_stop_tokens", "max_top_logprobs", "decode_segment"):
      option_checks.at_least(name, getattr(self, name), 1)


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


_OUTPUTS = ("tokens", "logprobs", "entropies", "count", "stopped", "top_ids", "top_logprobs")


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
    self._closed = False
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
    self._check_open("update")
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

  def sleep(self) -> None:
    """Between sampling and training: drops the kept KV caches (their device memory); the
    next step's new weights would drop them anyway."""
    self._cache.clear()

  def close(self) -> None:
    """Releases the sampler: drops the prefix cache and the compiled executables; later
    `generate` and `update` calls are refused (the `PolicySampler` protocol; unlike `sleep`,
    which only empties the cache until the next call)."""
    self._cache.clear()
    self._compiled.clear()
    self._continued.clear()
    self._decoders.clear()
    self._closed = True

  def _check_open(self, method: str) -> None:
    if self._closed:
      raise RuntimeError(f"{method}: this JaxSampler was closed")

  def generate(self, prompts: Sequence[Sequence[int]],
               params: SamplingParams) -> list[list[Sample]]:
    """For each prompt, `params.n` samples (see the module docstring)."""
    o = self.options
    self._check_open("generate")
    self._check(prompts, params)
    if len(params.stop_token_ids) > o.max_stop_tokens:
      raise ValueError(f"stop_token_ids: {len(params.stop_token_ids)} ids exceed "
                       f"options.max_stop_tokens={o.max_stop_tokens}")
    if params.top_logprobs > o.max_top_logprobs:
      raise ValueError(f"top_logprobs: {params.top_logprobs} exceeds "
                       f"options.max_top_logprobs={o.max_top_logprobs}")
    key = jax.random.key(params.seed)
    rows = [i for i in range(len(prompts)) for _ in range(params.n)]  # row → prompt
    # A row's random stream: its prompt's id and sample index with `row_ids` (wherever the
    # prompt lies in this call), else its index in its chunk.
    streams = ([params.row_ids[p] * params.n + j % params.n for j, p in enumerate(rows)]
               if params.row_ids else None)
    samples, kept = [], []
    for c, start in enumerate(range(0, len(rows), o.max_batch)):
      chunk_rows = rows[start:start + o.max_batch]
      chunk, cache = self._chunk(
          prompts, chunk_rows, params, jax.random.fold_in(key, 0 if streams else c),
          None if streams is None else streams[start:start + len(chunk_rows)])
      samples += chunk
      kept.append(cache)
    self.counters["calls"] += 1
    if o.reuse_cache and kept:
      self._keep(kept)
    return [samples[i * params.n:(i + 1) * params.n] for i in range(len(prompts))]

  def _keep(self, kept) -> None:
    """Stores the call's caches: each row under its prompt and sampled tokens but the last.
    `kept`: per chunk, its cache pieces [(k, v)] and {sequence: (piece, row)}."""
    pieces = [piece for chunk_pieces, _ in kept for piece in chunk_pieces]
    size = max(k.shape[2] for k, _ in pieces)
    pad = lambda x: jnp.pad(x, ((0, 0), (0, 0), (0, size - x.shape[2]), (0, 0), (0, 0)))
    offsets = np.cumsum([0] + [k.shape[1] for k, _ in pieces])
    total = int(offsets[-1])
    # One pool size (a power of two, the largest so far) for every store: the continuing
    # executables are compiled for it once, whatever the rows of the last call.
    self._pool_rows = max(self._pool_rows, bucket(total, 1))
    seqs: list = [[] for _ in range(self._pool_rows)]  # an empty sequence: a padding row
    first = 0
    for chunk_pieces, where in kept:
      for seq, (piece, row) in where:
        seqs[int(offsets[first + piece]) + row] = seq
      first += len(chunk_pieces)
    extra = ((0, 0), (0, self._pool_rows - total), (0, 0), (0, 0), (0, 0))
    k = jnp.pad(jnp.concatenate([pad(k) for k, _ in pieces], 1), extra)
    v = jnp.pad(jnp.concatenate([pad(v) for _, v in pieces], 1), extra)
    self._cache.store(k, v, seqs)

  def _check(self, prompts, params):
    if params.row_ids and len(params.row_ids) != len(prompts):
      raise ValueError(f"row_ids: {len(params.row_ids)} ids for {len(prompts)} prompts")
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

  def _exec(self, name: str, key: tuple, build):
    """The executable `name` of shape `key`, compiled ahead of time on first use."""
    if (name, key) not in self._decoders:
      self._decoders[name, key] = build()
    return self._decoders[name, key]

  def _specs(self, rows: int, size: int, new_tokens: int, top_k: int):
    """Abstract values of a decode carry and of a draw."""
    spec, i32, f32, c = jax.ShapeDtypeStruct, jnp.int32, jnp.float32, self.config
    kv = spec((c.num_layers, rows, size, c.num_kv_heads, c.head_dim), c.dtype)
    k = max(top_k, 1)
    loop = jax_decode.Loop(
        t=spec((), i32), cache=KVCache(kv, kv, spec((rows,), i32)), row=spec((rows,), i32),
        last=spec((rows,), i32),
        done=spec((rows,), bool), count=spec((rows,), i32), stopped=spec((rows,), bool),
        tokens=spec((rows, new_tokens), i32), logprobs=spec((rows, new_tokens), f32),
        entropies=spec((rows, new_tokens), f32), top_ids=spec((rows, new_tokens, k), i32),
        top_logprobs=spec((rows, new_tokens, k), f32))
    draw = Draw(jax.random.key(0), spec((), f32), spec((), f32), spec((), i32),
                spec((self.options.max_stop_tokens,), i32), spec((), f32))
    return loop, draw

  def _start_exec(self, rows: int, prompts: int, size: int, new_tokens: int, top_k: int):
    def build():
      spec, i32, f32, c = jax.ShapeDtypeStruct, jnp.int32, jnp.float32, self.config
      kv = spec((c.num_layers, prompts, size, c.num_kv_heads, c.head_dim), c.dtype)
      _, draw = self._specs(rows, size, new_tokens, top_k)
      fn = jax.jit(functools.partial(jax_decode.start, new_tokens, top_k))
      return fn.lower(spec((prompts, self.vocab_size), f32), KVCache(kv, kv, spec((prompts,), i32)),
                      spec((rows,), i32), spec((rows,), bool), spec((rows,), i32),
                      draw).compile()
    return self._exec("start", (rows, prompts, size, new_tokens, top_k), build)

  def _segment_exec(self, rows: int, size: int, new_tokens: int, top_k: int):
    def build():
      loop, draw = self._specs(rows, size, new_tokens, top_k)
      fn = jax.jit(functools.partial(jax_decode.segment, self.graphdef, self.options.decode_segment,
                                     top_k), donate_argnums=(1,))
      return fn.lower(self._state, loop, draw).compile()
    return self._exec("segment", (rows, size, new_tokens, top_k), build)

  def _take_exec(self, rows: int, to: int, size: int, new_tokens: int, top_k: int):
    def build():
      loop, _ = self._specs(rows, size, new_tokens, top_k)
      spec = jax.ShapeDtypeStruct
      return jax.jit(jax_decode.compact_rows).lower(loop, spec((to,), jnp.int32),
                                                  spec((to,), bool)).compile()
    return self._exec("take", (rows, to, size, new_tokens, top_k), build)

  def _executable(self, b: Bucket):
    """The prefill executable of a prefilling call."""
    if b not in self._compiled:
      spec, i32 = jax.ShapeDtypeStruct, jnp.int32
      size = b.prompt_len + b.new_tokens
      self._compiled[b] = jax.jit(functools.partial(
          jax_decode.prefill_prompts, self.graphdef, size)).lower(
              self._state, spec((b.prompts, b.prompt_len), i32), spec((b.prompts,), i32)).compile()
    return self._compiled[b]

  def _continue_exec(self, b: ContinueBucket):
    """The extend executable of a call that continues cached rows."""
    if b not in self._continued:
      spec, i32, c = jax.ShapeDtypeStruct, jnp.int32, self.config
      stored = spec((c.num_layers, b.stored_rows, b.stored_len, c.num_kv_heads, c.head_dim),
                    c.dtype)
      self._continued[b] = jax.jit(functools.partial(
          jax_decode.continue_rows, self.graphdef, b.cache_len)).lower(
              self._state, stored, stored, spec((b.prompts,), i32), spec((b.prompts,), i32),
              spec((b.prompts, b.suffix_len), i32), spec((b.prompts,), i32)).compile()
    return self._continued[b]

  def _chunk(self, prompts: Sequence[Sequence[int]], rows: list[int], params: SamplingParams,
             key, streams: Optional[Sequence[int]] = None):
    """Samples of `rows` (prompt indices, at most `max_batch`) in one prefill (or extend) and
    decode segments, row i drawing from random stream `streams[i]` (default: i); also returns
    the cache pieces and where each row's cache lies in them."""
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
      ext = self._continue_exec(cb)
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
      pre = self._executable(b)
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
    stream = np.arange(b.rows, dtype=np.int32)
    if streams is not None:
      stream[:len(rows)] = streams
    stops = np.full(o.max_stop_tokens, -1, np.int32)
    stops[:len(params.stop_token_ids)] = params.stop_token_ids
    draw = Draw(key, np.float32(params.temperature), np.float32(params.top_p),
                np.int32(params.max_new_tokens), stops,
                np.float32(1.0 / params.logprob_temperature))
    size = cache.k.shape[2]
    state = self._start_exec(b.rows, b.prompts, size, b.new_tokens, b.top_k)(
        logits, cache, source, live, stream, draw)
    outputs, pieces, where = self._decode(state, np.where(live, np.arange(b.rows), -1), draw,
                                          size, b.new_tokens, b.top_k, params.max_new_tokens)
    self.counters["prefill_s"] += t1 - t0
    self.counters["decode_s"] += time.perf_counter() - t1
    samples = [self._sample(outputs[i], params.top_logprobs) for i in range(len(rows))]
    self.counters["decode_tokens"] += sum(len(s.tokens) for s in samples)
    # Cached: the prompt and every sampled token but the last (never fed back).
    sequences = [list(prompts[p]) + s.tokens[:-1] for p, s in zip(rows, samples)]
    return samples, (pieces, [(sequences[i], where[i]) for i in range(len(rows))])

  def _decode(self, state, ids, draw, size: int, new_tokens: int, top_k: int, max_new: int):
    """Decode segments until every row is done, moving the rows still going into smaller
    buckets on the way. `ids`: the call's row of each bucket row (-1: padding). Returns each
    row's outputs, the cache pieces, and where each row's final cache lies (piece, row)."""
    o = self.options
    rows = len(ids)
    outputs, pieces, where = {}, [], {}

    def harvest(state, ids, done):
      host = jax.device_get({f: getattr(state, f) for f in _OUTPUTS})
      for r in np.flatnonzero(done & (ids >= 0)):
        if int(ids[r]) not in outputs:
          outputs[int(ids[r])] = {f: host[f][r] for f in _OUTPUTS}
          where[int(ids[r])] = (len(pieces), int(r))
      pieces.append((state.cache.k, state.cache.v))

    while True:
      state = self._segment_exec(rows, size, new_tokens, top_k)(self._state, state, draw)
      done = np.asarray(state.done)
      going = int(np.sum(~done))
      if going == 0 or int(state.t) >= max_new:
        break
      target = max(bucket(going, 1), o.min_decode_rows)
      if target <= rows // 2:
        harvest(state, ids, done)
        idx = np.flatnonzero(~done)
        keep = np.arange(target) < len(idx)
        idx = np.concatenate([idx, np.full(target - len(idx), idx[0])]).astype(np.int32)
        state = self._take_exec(rows, target, size, new_tokens, top_k)(state, idx, keep)
        ids, rows = np.where(keep, ids[idx], -1), target
    harvest(state, ids, np.ones(rows, bool))
    return outputs, pieces, where

  def _sample(self, out: dict, top_logprobs: int) -> Sample:
    n = int(out["count"])
    top = None
    if top_logprobs:
      ids, lps = out["top_ids"][:n, :top_logprobs], out["top_logprobs"][:n, :top_logprobs]
      top = [dict(zip(a.tolist(), b.tolist())) for a, b in zip(ids, lps)]
    return Sample(tokens=out["tokens"][:n].tolist(), logprobs=out["logprobs"][:n].tolist(),
                  finish_reason="stop" if out["stopped"] else "length",
                  policy_version=self.policy_version,
                  entropies=out["entropies"][:n].tolist(), top_logprobs=top)
