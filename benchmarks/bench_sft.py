"""Benchmark: the SFT step, padded against packed, on `make run`'s demonstrations (issue 38).

    python -m benchmarks.bench_sft --json=benchmarks/results/bench_sft_cpu.json

`make run`'s config (`configs/hidifftir.py:model=tiny`): its 2,000 demonstrations and its
batches (`SFTData.batch`, 16 rows, widths trimmed to the batch), the first `--steps` of them
from the same initial weights, once per variant (`--variants`: `padded`, or the packed step
at a token budget per micro-batch, e.g. `packed_1024`). Each variant runs all its steps in
turn, as a run does, so that its shapes settle as a run's would (`Packer.ratchet`), and the
variants alternate in `--rounds` rounds so that a slow minute of a shared machine falls on
all of them. Reported per variant: seconds per step (median over the rounds' steps, and the
total with compilations), the step's compilations, tokens forwarded per step (padding
included) against the batch's real tokens, the first step's loss against the first
variant's (the same batch from the same weights: float-level; later steps drift apart as any
two float orders of the same training do) and the mean loss of the last 20 steps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import sys
import time

import jax
import numpy as np
from absl import app, flags

from tirjax import cli, distributed
from tirjax.reporting import benchmark
from tirjax.testing.compile_counts import compiled_functions
from tirjax.trainer import parts, prepare
from tirjax.trainer.sft_data import SFTData
from tirjax.train_steps import SFTBatch, init_state
from tirjax.train_steps.steps import sft_step

flags.DEFINE_string("config", "hidifftir:model=tiny", "configs/<name>.py:<arg>")
flags.DEFINE_list("variants", ["padded", "packed_16384", "packed_1024"],
                  "padded, or packed_<tokens per micro-batch>")
flags.DEFINE_integer("steps", 100, "SFT steps per variant and round.")
flags.DEFINE_integer("rounds", 2, "Rounds; each runs every variant's steps.")
flags.DEFINE_string("json", None, "Result file.")
FLAGS = flags.FLAGS


def _options(variant: str, step):
  if variant == "padded":
    return dataclasses.replace(step, packed=False)
  kind, _, budget = variant.partition("_")
  if kind != "packed" or not budget.isdigit():
    raise app.UsageError(f"--variants: {variant!r} is not padded or packed_<tokens>")
  return dataclasses.replace(step, packed=True, max_tokens_per_microbatch=int(budget))


def main(argv):
  del argv
  distributed.initialize(distributed.DistributedOptions())
  info = benchmark.machine()
  name, _, arg = FLAGS.config.partition(":")
  config = __import__(f"configs.{name}", fromlist=["get_config"]).get_config(arg or None)
  exp = prepare.experiment(config)
  mesh, exp = parts.mesh(exp)
  with contextlib.ExitStack() as cleanup:
    data = parts.data(exp, cleanup)
    graphdef, params, phases = parts.model(exp, len(data.tokenizer), mesh)
    demos = SFTData.from_sequences(
        data.source.demonstrations(data.demo_tasks, data.tokenizer, exp.sft.demos,
                                   exp.sft.num_demos),
        exp.rollout.shapes.max_tokens, seed=exp.seed)
  phase = phases["sft"]
  batches = [SFTBatch(**demos.batch(i, exp.sft.batch_size)) for i in range(FLAGS.steps)]
  steps = {v: sft_step(graphdef, phase.tx, phase.place, exp.sft.loss,
                       _options(v, exp.sft.step)) for v in FLAGS.variants}
  times = {v: [] for v in FLAGS.variants}
  totals = {v: 0.0 for v in FLAGS.variants}
  compiles = {v: 0 for v in FLAGS.variants}
  losses, forwarded = {}, {}
  for _ in range(FLAGS.rounds):
    for v, step in steps.items():
      state = init_state(jax.tree.map(jax.numpy.copy, params), phase.tx, phase.place,
                         jax.random.key(0))
      losses[v], forwarded[v] = [], []
      with compiled_functions() as compiled:
        for batch in batches:
          start = time.perf_counter()
          state, metrics = jax.block_until_ready(step(state, batch))
          times[v].append(time.perf_counter() - start)
          totals[v] += times[v][-1]
          losses[v].append(float(metrics["loss"]))
          forwarded[v].append(float(metrics["tokens/forwarded"]))
      compiles[v] += sum(1 for f in compiled if f == "jit(step)")
  real = float(np.mean([np.asarray(b.token_valid).sum() for b in batches]))
  base = FLAGS.variants[0]
  out = dict(command="python -m benchmarks.bench_sft " + " ".join(sys.argv[1:]),
             machine=info, config=FLAGS.config, batch_size=exp.sft.batch_size,
             steps=FLAGS.steps, rounds=FLAGS.rounds, real_tokens_per_step=round(real, 1),
             variants={})
  for v in FLAGS.variants:
    out["variants"][v] = dict(
        seconds_per_step_median=round(statistics.median(times[v]), 4),
        seconds_per_round=round(totals[v] / FLAGS.rounds, 2),
        step_compilations=compiles[v],
        forwarded_per_step=round(float(np.mean(forwarded[v])), 1),
        first_loss_rel_diff_vs_first=abs(losses[v][0] - losses[base][0]) / abs(losses[base][0]),
        last20_loss_mean=round(float(np.mean(losses[v][-20:])), 4))
  med = {v: out["variants"][v]["seconds_per_step_median"] for v in FLAGS.variants}
  out["speedup_median_vs_first"] = {v: round(med[base] / med[v], 2) for v in FLAGS.variants}
  out["speedup_per_round_vs_first"] = {
      v: round(totals[base] / totals[v], 2) for v in FLAGS.variants}
  print(benchmark.write_result(FLAGS.json, out, indent=1))


if __name__ == "__main__":
  cli.run(main)
