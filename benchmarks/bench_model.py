"""Benchmark: chunked token log-probs (and their gradient) against the naive computation.

  python -m benchmarks.bench_model --json=benchmarks/results/bench_model_cpu.json

Only the final projection and log-softmax: hidden states `[B, L, D]` and an unembedding
`[V, D]` (V = 151,936, Qwen3's vocabulary) → log p(token) `[B, L]`. Two measurements:

* peak memory from XLA's compiled memory analysis (`benchmark.compiled_memory`'s `peak_bytes`:
  temp + output bytes; CPU has no allocator statistics), at the full size (`--batch` ×
  `--length` tokens) — compiled, not run;
* wall-time medians at `--time_batch` rows (the naive gradient at the full size needs several
  `[B·L, V]` float32 buffers, more memory than a shared CPU machine has).

Targets: chunked peak memory ≤ 1/4 of naive, time ≤ 1.25× naive.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
from absl import flags

from tirjax import cli
from tirjax.models.logprobs import logprobs_from_hidden
from tirjax.reporting import benchmark

FLAGS = flags.DEFINE_string("json", None, "write results here")
_BATCH = flags.DEFINE_integer("batch", 8, "rows for the memory analysis")
_LENGTH = flags.DEFINE_integer("length", 2048, "tokens per row")
_HIDDEN = flags.DEFINE_integer("hidden", 1024, "hidden size (qwen3_0p6b: 1024)")
_VOCAB = flags.DEFINE_integer("vocab", 151936, "vocabulary size (Qwen3: 151,936)")
_CHUNK = flags.DEFINE_integer("chunk_size", 1024, "rows of logits per chunk")
_TIME_BATCH = flags.DEFINE_integer("time_batch", 1, "rows for the timing runs")
_REPEATS = flags.DEFINE_integer("repeats", 3, "timed runs per case (after one warm-up)")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "hidden/weight dtype")


def naive(h, w, tokens, valid):
  """log_softmax over full `[B, L, V]` float32 logits."""
  z = jnp.einsum("bld,vd->blv", h, w, preferred_element_type=jnp.float32)
  logp = jnp.take_along_axis(jax.nn.log_softmax(z[:, :-1], axis=-1), tokens[:, 1:, None],
                             axis=-1)[..., 0]
  logp = jnp.concatenate([jnp.zeros((h.shape[0], 1)), logp], axis=1)
  return jnp.where(valid.at[:, 0].set(False), logp, 0.0)


def chunked(h, w, tokens, valid):
  return logprobs_from_hidden(h, w, tokens, valid, chunk_size=_CHUNK.value)[0]


def with_grad(f):
  def loss(h, w, tokens, valid, c):
    return jnp.sum(f(h, w, tokens, valid) * c)
  return jax.value_and_grad(loss, argnums=(0, 1))


def inputs(batch):
  k = jax.random.split(jax.random.key(0), 4)
  b, l, d, v = batch, _LENGTH.value, _HIDDEN.value, _VOCAB.value
  h = jax.random.normal(k[0], (b, l, d), _DTYPE.value)
  w = (jax.random.normal(k[1], (v, d)) * d**-0.5).astype(_DTYPE.value)
  tokens = jax.random.randint(k[2], (b, l), 0, v)
  valid = jnp.ones((b, l), bool)
  c = jax.random.normal(k[3], (b, l))
  return h, w, tokens, valid, c


def compiled(fn, args):
  """`fn` compiled for `args`, not run."""
  return jax.jit(fn).lower(*args).compile()


def wall(fn, args) -> dict:
  f = jax.jit(fn)
  jax.block_until_ready(f(*args))
  times = []
  for _ in range(_REPEATS.value):
    t = time.perf_counter()
    jax.block_until_ready(f(*args))
    times.append(time.perf_counter() - t)
  return {"median_s": statistics.median(times), "times_s": times}


def main(_):
  cases = {
      "logprobs": (lambda h, w, t, v, c: naive(h, w, t, v),
                   lambda h, w, t, v, c: chunked(h, w, t, v)),
      "logprobs_grad": (with_grad(naive), with_grad(chunked)),
  }
  info = benchmark.machine()
  full, small = inputs(_BATCH.value), inputs(_TIME_BATCH.value)
  results = {}
  for name, (f_naive, f_chunked) in cases.items():
    # Both take the same arguments and donate none: they compare on `peak_bytes`, temporaries
    # + outputs.
    mem = {"naive": benchmark.compiled_memory(compiled(f_naive, full)),
           "chunked": benchmark.compiled_memory(compiled(f_chunked, full))}
    mem["ratio"] = mem["chunked"]["peak_bytes"] / mem["naive"]["peak_bytes"]
    t = {"naive": wall(f_naive, small), "chunked": wall(f_chunked, small)}
    t["ratio"] = t["chunked"]["median_s"] / t["naive"]["median_s"]
    results[name] = {"memory": mem, "time": t}
    print(f"{name}: peak memory chunked/naive = {mem['ratio']:.3f} "
          f"({mem['chunked']['peak_bytes'] / 2**30:.2f} / {mem['naive']['peak_bytes'] / 2**30:.2f}"
          f" GiB); time chunked/naive = {t['ratio']:.3f} ({t['chunked']['median_s']:.2f} / "
          f"{t['naive']['median_s']:.2f} s)")
  report = {
      "benchmark": "bench_model",
      "shapes": {"memory_tokens": _BATCH.value * _LENGTH.value, "batch": _BATCH.value,
                 "length": _LENGTH.value, "time_batch": _TIME_BATCH.value,
                 "time_tokens": _TIME_BATCH.value * _LENGTH.value, "hidden": _HIDDEN.value,
                 "vocab": _VOCAB.value, "chunk_size": _CHUNK.value, "dtype": _DTYPE.value},
      "targets": {"memory_ratio_max": 0.25, "time_ratio_max": 1.25},
      "results": results,
      "machine": info,
  }
  benchmark.write_result(FLAGS.value, report)


if __name__ == "__main__":
  cli.run(main)
