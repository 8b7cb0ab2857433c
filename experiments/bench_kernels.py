"""Advantage kernels and matchers against their loop references, at paper scale.

    python -m experiments.bench_kernels --json=benchmarks/results/bench_kernels_cpu.json

Batches (SPEC §4, issue "Foundation"; `--queries` scales both):
  * independent: 256 queries × 16 rows × 10 steps × 4 calls per step × 8 ground-truth calls
    (`synthetic_calls.random_call_rollouts`), for every estimator but `portool`;
  * tree: 256 queries, PORTool trees with n = 8, f = 2, T_max = 6 (`synthetic.tree_rollouts`),
    for `portool` (and `grpo` on the same trees, for comparison).
Each jitted kernel is compiled first, then timed `--repeats` times; each reference
(`tests/reference`: plain Python loops over groups, trees and rows, scipy's
`linear_sum_assignment` per row) `--ref-repeats` times. Reported: medians in milliseconds of
wall time, and of CPU time of this process (robust to other load on a shared machine).
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
from tests.reference import REFERENCES
from tests.reference import matching as ref_matching
from tirjax import advantages, synthetic
from tirjax.matching.greedy import greedy_matching
from tirjax.matching.hungarian import max_weight_matching
from tirjax.matching.sinkhorn import ot_call_rewards
from tirjax.synthetic_calls import random_call_rollouts


def timed(fn, repeats: int) -> tuple[float, float]:
  """Median (wall, cpu) milliseconds over `repeats` calls."""
  wall, cpu = [], []
  for _ in range(repeats):
    c, w = time.process_time(), time.perf_counter()
    jax.block_until_ready(fn())
    wall.append(time.perf_counter() - w)
    cpu.append(time.process_time() - c)
  return 1e3 * float(np.median(wall)), 1e3 * float(np.median(cpu))


def matcher_cases(r, batch):
  """The batched assignment kernels against their per-row loops (scipy for the exact one)."""
  B, T, K, C = r.call_sim.shape
  sim = r.call_sim.reshape(B, T * K, C)
  pv, gv = r.call_valid.reshape(B, T * K), r.gt_valid
  rows = [b for b in range(B) if batch["row_valid"][b]]

  def per_row(method):
    def run():
      for b in rows:
        calls, gts = ref_matching.row_calls(batch, b), ref_matching.row_gts(batch, b)
        s = ref_matching.row_sim(batch, b, calls, gts)
        if method == "sinkhorn":
          if calls and gts:
            ref_matching.sinkhorn_knopp(np.full(len(calls), 1 / len(calls)),
                                        np.full(len(gts), 1 / len(gts)), s, 0.1)
        else:
          ref_matching.MATCHINGS[method](s)
    return run

  return {
      "assignment_hungarian": (jax.jit(max_weight_matching), (sim, pv, gv), per_row("hungarian")),
      "assignment_greedy": (jax.jit(greedy_matching), (sim, pv, gv), per_row("greedy")),
      "assignment_sinkhorn": (jax.jit(ot_call_rewards), (sim, pv, gv), per_row("sinkhorn")),
  }


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--json", default="benchmarks/results/bench_kernels_cpu.json")
  p.add_argument("--repeats", type=int, default=7)
  p.add_argument("--ref-repeats", type=int, default=3)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--only", default="", help="comma-separated subset of the kernel names")
  p.add_argument("--queries", type=int, default=256,
                 help="queries per batch (256: the papers' batch; 2048: 8x, as on the GPU)")
  args = p.parse_args()
  if args.queries < 1:
    p.error(f"--queries: must be >= 1, got {args.queries}")

  flat = random_call_rollouts(args.seed, num_queries=args.queries)
  flat_batch = to_batch(flat)
  tree = synthetic.tree_rollouts(np.random.default_rng(args.seed), [8] * args.queries,
                                 branching=2, max_depth=6)
  tree_batch = to_batch(tree)

  cases = {}
  for name in advantages.names():
    r, batch = (tree, tree_batch) if name == "portool" else (flat, flat_batch)
    cases[name] = (advantages.get(name), (r,), lambda name=name, batch=batch: REFERENCES[name](batch))
  cases["grpo_on_trees"] = (advantages.get("grpo"), (tree,), lambda: REFERENCES["grpo"](tree_batch))
  cases.update(matcher_cases(flat, flat_batch))
  if args.only:
    cases = {k: cases[k] for k in args.only.split(",")}

  records = []
  for name, (fn, fargs, reference) in cases.items():
    jax.block_until_ready(fn(*fargs))  # compile
    jax_ms, jax_cpu_ms = timed(lambda: fn(*fargs), args.repeats)
    ref_ms, ref_cpu_ms = timed(reference, args.ref_repeats)
    rec = dict(name=name, jax_ms=jax_ms, reference_ms=ref_ms, speedup=ref_ms / jax_ms,
               jax_cpu_ms=jax_cpu_ms, reference_cpu_ms=ref_cpu_ms,
               speedup_cpu=ref_cpu_ms / max(jax_cpu_ms, 1e-9))
    records.append(rec)
    print(f"{name:22s} jax {jax_ms:9.2f} ms | reference {ref_ms:9.1f} ms | "
          f"speed-up {rec['speedup']:7.1f}x wall {rec['speedup_cpu']:7.1f}x cpu", flush=True)

  B, T, K, C = flat.call_sim.shape
  out = dict(
      command="python -m experiments.bench_kernels " + " ".join(
          f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if v != ""),
      device=str(jax.devices()[0]),
      machine=dict(platform=platform.platform(), processor=platform.processor(),
                   cpus=os.cpu_count(), load_avg=os.getloadavg(), jax=jax.__version__),
      batch=dict(independent=dict(queries=args.queries, rows=B, steps=T, calls_per_step=K, gt_calls=C,
                                  valid_rows=int(flat_batch["row_valid"].sum())),
                 tree=dict(queries=args.queries, n=8, f=2, T_max=6, rows=tree.num_rows)),
      records=records)
  os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
  with open(args.json, "w") as f:
    json.dump(out, f, indent=2)


if __name__ == "__main__":
  main()
