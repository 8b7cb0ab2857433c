"""Advantage kernels and matchers against their loop references, at paper scale.

    python -m benchmarks.bench_kernels --json=benchmarks/results/bench_kernels_cpu.json

Batches (spec §4, issue "Foundation"; `--queries` scales both):
  * independent: 256 queries × 16 rows × 10 steps × 4 calls per step × 8 ground-truth calls
    (`synthetic_calls.random_call_rollouts`; `--steps`, `--calls`, `--gt_calls`), for every
    estimator but the tree ones;
  * tree: 256 queries, PORTool trees with n = 8, f = 2, T_max = 6 (`synthetic.tree_rollouts`),
    for the estimators registered to train on trees (`tree_estimators()`: `portool`,
    `tree_grpo`; and `grpo` on the same trees, for comparison).
Each jitted kernel is compiled first, then timed `--repeats` times; each reference
(`tirjax/testing/reference`: plain Python loops over groups, trees and rows, scipy's
`linear_sum_assignment` per row) `--ref_repeats` times. Reported: medians in milliseconds of
wall time, and of CPU time of this process (robust to other load on a shared machine).
`assignment_hungarian_optax` times `optax.assignment.hungarian_algorithm` (vmapped) on the same
batch as `assignment_hungarian`, against the same scipy loop (why the project keeps its own
matcher: `tirjax/matching/hungarian.py`).
"""

from __future__ import annotations

import json
import os
import sys
import time

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np
import optax

from tirjax import advantages, cli
from tirjax.testing import synthetic
from tirjax.matching.greedy import greedy_matching
from tirjax.matching.hungarian import masked_weights, max_weight_matching
from tirjax.matching.sinkhorn import ot_call_rewards
from tirjax.reporting import benchmark
from tirjax.testing.critic_values import with_values
from tirjax.testing.estimator_checks import stand_in_answer_logprob
from tirjax.testing.synthetic_calls import random_call_rollouts
from tirjax.rollouts import to_numpy
from tirjax.testing.reference import REFERENCES
from tirjax.testing.reference import matching as ref_matching

_JSON = flags.DEFINE_string("json", "benchmarks/results/bench_kernels_cpu.json", "result file")
_REPEATS = flags.DEFINE_integer("repeats", 7, "timed calls of each kernel", lower_bound=1)
_REF_REPEATS = flags.DEFINE_integer("ref_repeats", 3, "timed calls of each reference",
                                    lower_bound=1)
_SEED = flags.DEFINE_integer("seed", 0, "seed of the random batches")
_ONLY = flags.DEFINE_list("only", [], "a subset of the kernel names")
_QUERIES = flags.DEFINE_integer("queries", 256, "queries per batch (256: the papers' batch; "
                                "2048: 8x, as on the GPU)", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps", 10, "steps per row of the independent batch", lower_bound=1)
_CALLS = flags.DEFINE_integer("calls", 4, "calls per step of the independent batch", lower_bound=1)
_GT_CALLS = flags.DEFINE_integer("gt_calls", 8, "ground-truth calls per query of the independent "
                                 "batch (the exact matcher's compile time grows with it)",
                                 lower_bound=1)


def tree_estimators() -> tuple[str, ...]:
  """The estimators timed on rollout trees (their registration's rollout mode is "tree"); the
  others run on flat rows."""
  return tuple(n for n in advantages.names() if advantages.get(n).rollout_mode == "tree")


def estimator_cases(tree, tree_batch, flat, flat_batch, seed: int = 0) -> dict:
  """{name: (kernel, args, reference call)} of every registered estimator, on the rollout trees
  or the flat rows (`tree_estimators`; `*_batch` their numpy arrays), each against the
  reference its registration names. An estimator that reads a critic's values (ppo, turn_ppo)
  gets a stand-in critic's (`with_values`, drawn from `seed`); igpo, which reads the answer
  probes, gets `estimator_checks.stand_in_answer_logprob`'s."""
  cases = {}
  for name in advantages.names():
    r, batch = (tree, tree_batch) if name in tree_estimators() else (flat, flat_batch)
    if "values" in advantages.get(name).needs:
      r = with_values(r, seed)
      batch = to_numpy(r)
    if "answer_logprob" in advantages.get(name).needs:
      r = r.replace(answer_logprob=stand_in_answer_logprob(r))
      batch = to_numpy(r)
    cases[name] = (advantages.get(name), (r,),
                   lambda name=name, batch=batch: REFERENCES[name](batch))
  return cases


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

  def optax_hungarian(sim, pv, gv):
    # Ground-truth calls as the assigned rows, as in the project's matcher.
    cost = -jnp.swapaxes(masked_weights(sim, pv, gv), 1, 2)
    return jax.vmap(optax.assignment.hungarian_algorithm)(cost)

  return {
      "assignment_hungarian": (jax.jit(max_weight_matching), (sim, pv, gv), per_row("hungarian")),
      "assignment_hungarian_optax": (jax.jit(optax_hungarian), (sim, pv, gv),
                                     per_row("hungarian")),
      "assignment_greedy": (jax.jit(greedy_matching), (sim, pv, gv), per_row("greedy")),
      "assignment_sinkhorn": (jax.jit(ot_call_rewards), (sim, pv, gv), per_row("sinkhorn")),
  }


def main(argv):
  del argv
  info = benchmark.machine()
  flat = random_call_rollouts(_SEED.value, num_queries=_QUERIES.value, max_steps=_STEPS.value,
                              max_calls=_CALLS.value, max_gt_calls=_GT_CALLS.value)
  flat_batch = to_numpy(flat)
  tree = synthetic.tree_rollouts(np.random.default_rng(_SEED.value), [8] * _QUERIES.value,
                                 branching=2, max_depth=6)
  tree_batch = to_numpy(tree)

  cases = estimator_cases(tree, tree_batch, flat, flat_batch, seed=_SEED.value)
  cases["grpo_on_trees"] = (advantages.get("grpo"), (tree,), lambda: REFERENCES["grpo"](tree_batch))
  valued_tree = with_values(tree, _SEED.value)  # the critic's estimators on trees too
  valued_tree_batch = to_numpy(valued_tree)
  for name in ("ppo", "turn_ppo"):
    cases[f"{name}_on_trees"] = (advantages.get(name), (valued_tree,),
                                 lambda name=name: REFERENCES[name](valued_tree_batch))
  cases.update(matcher_cases(flat, flat_batch))
  if _ONLY.value:
    unknown = sorted(set(_ONLY.value) - set(cases))
    if unknown:
      raise app.UsageError(f"--only: unknown kernel(s) {unknown}; known: {sorted(cases)}")
    cases = {k: cases[k] for k in _ONLY.value}

  B, T, K, C = flat.call_sim.shape
  out = dict(
      command="python -m benchmarks.bench_kernels " + " ".join(sys.argv[1:]),
      device=str(jax.devices()[0]), machine=info,
      batch=dict(independent=dict(queries=_QUERIES.value, rows=B, steps=T, calls_per_step=K,
                                  gt_calls=C, valid_rows=int(flat_batch["row_valid"].sum())),
                 tree=dict(queries=_QUERIES.value, n=8, f=2, T_max=6, rows=tree.num_rows)),
      records=[])
  for name, (fn, fargs, reference) in cases.items():
    jax.block_until_ready(fn(*fargs))  # compile
    jax_ms, jax_cpu_ms = timed(lambda: fn(*fargs), _REPEATS.value)
    ref_ms, ref_cpu_ms = timed(reference, _REF_REPEATS.value)
    rec = dict(name=name, jax_ms=jax_ms, reference_ms=ref_ms, speedup=ref_ms / jax_ms,
               jax_cpu_ms=jax_cpu_ms, reference_cpu_ms=ref_cpu_ms,
               speedup_cpu=ref_cpu_ms / max(jax_cpu_ms, 1e-9))
    out["records"].append(rec)
    print(f"{name:26s} jax {jax_ms:9.2f} ms | reference {ref_ms:9.1f} ms | "
          f"speed-up {rec['speedup']:7.1f}x wall {rec['speedup_cpu']:7.1f}x cpu", flush=True)
    benchmark.write_result(_JSON.value, out)  # after every kernel: a stopped run keeps its rows
  if _JSON.value:
    benchmark.write_markdown(os.path.splitext(_JSON.value)[0] + ".md", markdown(out))


def markdown(out: dict) -> str:
  """The result as a table (wall and CPU-time speed-ups; target >= 20x)."""
  m = out["machine"]
  lines = ["# Kernels against their loop references\n",
           f"Command: `{out['command']}`\n",
           f"Machine: {m['cpu']}, {m['cpus']} CPUs, jax {m['jax']} ({out['device']}); load "
           f"average {m['load_average_start'][0]:.2f} at the start, "
           f"{m['load_average_end'][0]:.2f} at the end.\n",
           f"Batch: {json.dumps(out['batch'])}\n",
           "| kernel | jax ms | reference ms | speed-up (wall) | speed-up (CPU time) |",
           "| --- | ---: | ---: | ---: | ---: |"]
  for r in out["records"]:
    lines.append(f"| {r['name']} | {r['jax_ms']:.2f} | {r['reference_ms']:.1f} | "
                 f"{r['speedup']:.1f}x | {r['speedup_cpu']:.1f}x |")
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  cli.run(main)
