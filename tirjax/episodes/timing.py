"""Wall time of rollout modes at equal n with a given sampler (used by `benchmarks/bench_sampler`).

The tree mode makes one sampler call per depth with f candidates per active node and selects
n − n_c of them, so it samples up to f times the tokens of independent rollouts, in about as
many calls; this measures what that costs with a real sampler.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import numpy as np

from tirjax.env.tools import Task
from tirjax.episodes.batch import rollout
from tirjax.episodes.options import RolloutOptions
from tirjax.sampling.interface import Sampler


def time_modes(sampler: Sampler, tokenizer, tasks: Sequence[Task], options: RolloutOptions,
               modes: Sequence[str] = ("tree", "independent"), repeats: int = 3,
               warmup: int = 1) -> dict[str, dict]:
  """Per mode: median wall time of `rollout` over `repeats` runs (after `warmup` untimed runs,
  which absorb compilation) and the counters of the last run. `options.n` is shared."""
  if repeats < 1 or warmup < 0:
    raise ValueError(f"repeats / warmup: need repeats >= 1 and warmup >= 0, got "
                     f"{repeats} / {warmup}")
  out = {}
  for mode in modes:
    opts = dataclasses.replace(options, mode=mode)
    rng = np.random.default_rng(options.seed)
    for _ in range(warmup):
      rollout(sampler, tokenizer, tasks, opts, rng=rng)
    times = []
    for _ in range(repeats):
      t0 = time.perf_counter()
      batch = rollout(sampler, tokenizer, tasks, opts, rng=rng)
      times.append(time.perf_counter() - t0)
    s = batch.stats
    out[mode] = dict(wall_s=float(np.median(times)), wall_s_all=times, rows=s["rows"],
                     sampler_calls=s["sampler_calls"], prompts=s["prompts"],
                     sampled_tokens=s["sampled_tokens"], sampler_s=s["sampler_s"],
                     env_s=s["env_s"], judge_s=s["judge_s"],
                     tokens_per_s=s["sampled_tokens"] / max(s["sampler_s"], 1e-9))
  return out
