"""Matching kernels and estimators against their loop references, at paper scale.

    python -m experiments.bench_matching --json=benchmarks/results/bench_matching_cpu.json

Batch: `synthetic_calls.random_call_rollouts` (256 queries × 16 rows, 10 turns, 4 calls a turn,
8 ground-truth calls). Each jitted kernel is timed after compilation (best of `--repeats`);
each reference (tests/reference: per-row Python, scipy, POT's loop) once. Times are CPU
seconds of this process (robust to other load on a shared machine) and wall seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import jax
import numpy as np

from tests.call_batches import to_batch
from tests.reference import matching as ref
from tirjax import advantages
from tirjax.matching.greedy import greedy_matching
from tirjax.matching.hungarian import max_weight_matching
from tirjax.matching.sinkhorn import ot_call_rewards
from tirjax.synthetic_calls import random_call_rollouts


def timed(fn, repeats):
  """Best (cpu, wall) seconds of `repeats` calls."""
  best = (np.inf, np.inf)
  for _ in range(repeats):
    c, w = time.process_time(), time.perf_counter()
    jax.block_until_ready(fn())
    best = min(best, (time.process_time() - c, time.perf_counter() - w))
  return best


def per_row(batch, rows, fn):
  return lambda: [fn(batch, b) for b in rows]


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--json", default="benchmarks/results/bench_matching_cpu.json")
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--only", default="", help="comma-separated subset of the kernels to run")
  args = p.parse_args()

  r = random_call_rollouts(args.seed)
  batch = to_batch(r)
  B, T, K, C = r.call_sim.shape
  rows = [b for b in range(B) if batch["row_valid"][b]]
  sim = r.call_sim.reshape(B, T * K, C)
  pv, gv = r.call_valid.reshape(B, T * K), r.gt_valid

  def matching_ref(method):
    def one(batch, b):
      calls, gts = ref.row_calls(batch, b), ref.row_gts(batch, b)
      return ref.MATCHINGS[method](ref.row_sim(batch, b, calls, gts))
    return per_row(batch, rows, one)

  def ot_ref(batch, b):
    calls, gts = ref.row_calls(batch, b), ref.row_gts(batch, b)
    if calls and gts:
      ref.sinkhorn_knopp(np.full(len(calls), 1 / len(calls)), np.full(len(gts), 1 / len(gts)),
                         ref.row_sim(batch, b, calls, gts), 0.1)

  kernels = {
      "hungarian": (jax.jit(max_weight_matching), (sim, pv, gv), matching_ref("hungarian")),
      "greedy": (jax.jit(greedy_matching), (sim, pv, gv), matching_ref("greedy")),
      "sinkhorn": (jax.jit(ot_call_rewards), (sim, pv, gv), per_row(batch, rows, ot_ref)),
  }
  for name in ("hidifftir", "matchtir_km", "matchtir_ot", "toolrl", "ftrl"):
    est = advantages.get(name)
    kernels[name] = (est, (r,), lambda name=name: ref.REFERENCES[name](batch))

  if args.only:
    kernels = {k: kernels[k] for k in args.only.split(",")}
  results = {}
  for name, (fn, fargs, reference) in kernels.items():
    c0 = time.perf_counter()
    jax.block_until_ready(fn(*fargs))
    compile_s = time.perf_counter() - c0
    k_cpu, k_wall = timed(lambda: fn(*fargs), args.repeats)
    r_cpu, r_wall = timed(reference, 1)
    results[name] = dict(kernel_cpu_s=k_cpu, kernel_wall_s=k_wall, reference_cpu_s=r_cpu,
                         reference_wall_s=r_wall, speedup_cpu=r_cpu / k_cpu,
                         speedup_wall=r_wall / k_wall, first_call_s=compile_s)
    print(f"{name:12s} kernel {k_cpu * 1e3:8.1f} ms cpu {k_wall * 1e3:8.1f} ms wall | "
          f"reference {r_cpu:7.2f} s cpu | speed-up {r_cpu / k_cpu:6.1f}x cpu "
          f"{r_wall / k_wall:6.1f}x wall", flush=True)

  out = dict(batch=dict(B=B, T=T, K=K, C=C, valid_rows=len(rows),
                        calls=int(np.asarray(r.call_valid).sum())),
             machine=dict(platform=platform.platform(), cpus=os.cpu_count(),
                          load_avg=os.getloadavg(), jax=jax.__version__,
                          device=str(jax.devices()[0])),
             results=results)
  os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
  with open(args.json, "w") as f:
    json.dump(out, f, indent=2)


if __name__ == "__main__":
  main()
