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
from typing import NamedTuple, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tirjax.models.decoder import Decoder
from tirjax.models.kv_cache import KVCache, decode_step, prefill
from tirjax.sampling.choice import choose, raw_stats
from tirjax.sampling.interface import Sample, SamplingParams


def bucket(size: int, minimum: int) -> int:
  """The smallest power of two ≥ size, at least `minimum`."""
  return max(minimum, 1 << max(size - 1, 0).bit_length())


@dataclasses.dataclass(frozen=True)
class JaxSamplerOptions:
  """Shape buckets and limits of the built-in sampler.

  Attributes:
    min_batch: smallest row bucket (a power of two).
    max_batch: most rows per device call (a power of two); more rows run as several calls.
    min_prompt_len: smallest prompt-length bucket (a power of two).
    min_new_tokens: smallest new-token bucket (a power of two).
    max_stop_tokens: stop ids per request (a traced array of this size).
    max_top_logprobs: top log-probs computed when a request asks for any (`top_k` is static).
  """

  min_batch: int = 8
  max_batch: int = 256
  min_prompt_len: int = 64
  min_new_tokens: int = 16
  max_stop_tokens: int = 8
  max_top_logprobs: int = 20

  def __post_init__(self):
    for name in ("min_batch", "max_batch", "min_prompt_len", "min_new_tokens"):
      value = getattr(self, name)
      if value < 1 or value & (value - 1):
        raise ValueError(f"{name}: must be a power of two, got {value}")
    if self.max_batch < self.min_batch:
      raise ValueError(f"max_batch: must be >= min_batch={self.min_batch}, got "
                       f"{self.max_batch}")
    for name in ("max_stop_tokens", "max_top_logprobs"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")


class Bucket(NamedTuple):
  rows: int
  prompts: int
  prompt_len: int
  new_tokens: int
  top_k: int  # 0: no top log-probs


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


def _generate(graphdef, new_tokens: int, top_k: int, state, prompts, lengths, source, live,
              key, temperature, top_p, max_new, stop_ids) -> dict:
  """Prefill of `[Q, P]` prompts, then the decode loop over `[B]` rows; row b extends prompt
  `source[b]`, and is padding unless `live[b]`."""
  model = nnx.merge(graphdef, state)
  b = source.shape[0]
  logits, cache = prefill(model, prompts, lengths, prompts.shape[1] + new_tokens)
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
             stopped=s.stopped)
  if top_k:
    out.update(top_ids=s.top_ids, top_logprobs=s.top_logprobs)
  return out


class JaxSampler:
  """`Sampler` (tirjax.sampling.interface) over a `Decoder` with bucketed, compiled shapes.

  The sampler holds the given parameter arrays (no copy): a trainer that donates its
  parameter buffers must hand over copies.
  """

  def __init__(self, model: Decoder, options: JaxSamplerOptions = JaxSamplerOptions(),
               policy_version: int = 0):
    self.options = options
    self.config = model.config
    self.graphdef, self._state = nnx.split(model)
    self.vocab_size = model.config.vocab_size
    self.policy_version = int(policy_version)
    self._compiled: dict[Bucket, object] = {}

  @property
  def compiled_buckets(self) -> tuple[Bucket, ...]:
    """The buckets compiled so far, in order: one executable each."""
    return tuple(self._compiled)

  def update(self, model_or_state: Union[Decoder, nnx.State], policy_version: int) -> None:
    """New weights (same structure, shapes and dtypes) and their version; no recompilation.

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
    samples = []
    for c, start in enumerate(range(0, len(rows), o.max_batch)):
      samples += self._chunk(prompts, rows[start:start + o.max_batch], params,
                             jax.random.fold_in(key, c))
    return [samples[i * params.n:(i + 1) * params.n] for i in range(len(prompts))]

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
    return Bucket(rows=bucket(rows, o.min_batch), prompts=bucket(prompts, o.min_batch),
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

  def _executable(self, b: Bucket):
    if b not in self._compiled:
      o = self.options
      fn = jax.jit(functools.partial(_generate, self.graphdef, b.new_tokens, b.top_k))
      i32, f32 = jnp.int32, jnp.float32
      spec = jax.ShapeDtypeStruct
      self._compiled[b] = fn.lower(
          self._state, spec((b.prompts, b.prompt_len), i32), spec((b.prompts,), i32),
          spec((b.rows,), i32), spec((b.rows,), bool), jax.random.key(0), spec((), f32),
          spec((), f32), spec((), i32), spec((o.max_stop_tokens,), i32)).compile()
    return self._compiled[b]

  def _chunk(self, prompts: Sequence[Sequence[int]], rows: list[int], params: SamplingParams,
             key) -> list[Sample]:
    """Samples of `rows` (prompt indices, at most `max_batch`) in one device call."""
    o = self.options
    distinct = list(dict.fromkeys(rows))
    b = self.bucket_for(len(rows), max(len(prompts[p]) for p in distinct),
                        params.max_new_tokens, params.top_logprobs, len(distinct))
    tokens = np.zeros((b.prompts, b.prompt_len), np.int32)
    lengths = np.ones(b.prompts, np.int32)  # padding prompts: one token
    for j, p in enumerate(distinct):
      tokens[j, :len(prompts[p])] = prompts[p]
      lengths[j] = len(prompts[p])
    slot = {p: j for j, p in enumerate(distinct)}
    source = np.zeros(b.rows, np.int32)
    source[:len(rows)] = [slot[p] for p in rows]
    live = np.arange(b.rows) < len(rows)  # padding rows are done from the start
    stops = np.full(o.max_stop_tokens, -1, np.int32)
    stops[:len(params.stop_token_ids)] = params.stop_token_ids
    out = self._executable(b)(
        self._state, tokens, lengths, source, live, key, np.float32(params.temperature),
        np.float32(params.top_p), np.int32(params.max_new_tokens), stops)
    out = jax.device_get(out)
    return [self._sample(out, i, params.top_logprobs) for i in range(len(rows))]

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
