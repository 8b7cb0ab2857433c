"""Sampler throughput: generated tokens per second of one `Sampler.generate` call, the one
measure both samplers' benchmarks report (`benchmarks.bench_sampler` for the JAX sampler,
`benchmarks.bench_vllm` for the vLLM server), so that their figures compare."""

from __future__ import annotations

import statistics
import time

import numpy as np

from tirjax.sampling.interface import Sampler, SamplingParams


def throughput(sampler: Sampler, batch: int, prompt_len: int, new_tokens: int, repeats: int,
               vocab_size: int) -> dict:
  """Generated tokens per second at `batch` rows of `prompt_len` random tokens (ids 2 up to
  `vocab_size`, past the usual special ids; drawn from seed `batch`), `new_tokens` sampled
  each: the median of `repeats` timed calls after one untimed call of the same shape (it
  compiles the JAX sampler's bucket and warms vLLM's request path)."""
  if min(batch, prompt_len, new_tokens, repeats) < 1 or vocab_size < 3:
    raise ValueError(f"throughput: need batch, prompt_len, new_tokens, repeats >= 1 and "
                     f"vocab_size >= 3, got {batch}, {prompt_len}, {new_tokens}, {repeats}, "
                     f"{vocab_size}")
  prompts = np.random.default_rng(batch).integers(2, vocab_size, (batch, prompt_len)).tolist()
  params = SamplingParams(max_new_tokens=new_tokens, seed=0)
  sampler.generate(prompts, params)
  rates, times, tokens = [], [], 0
  for _ in range(repeats):
    start = time.perf_counter()
    out = sampler.generate(prompts, params)
    seconds = time.perf_counter() - start
    tokens = sum(len(s.tokens) for group in out for s in group)
    rates.append(tokens / seconds)
    times.append(seconds)
  return {"batch": batch, "tokens_per_s": statistics.median(rates), "tokens_per_call": tokens,
          "seconds_all": times, "tokens_per_s_all": rates}
