"""A step-time model of one RL step at paper scale: what it samples, trains and hands over, and
how long it takes on a number of H200s or TPU v5p chips.

    python -m experiments.studies.step_time                      # the papers' sizes, a table
    python -m experiments.studies.step_time --model=qwen3_8b --queries=256 --rows=16 --context=32768 \\
        --chips=8 --chip=h200

A roofline estimate, not a measurement: every constant is named below with its source. The step
is modelled as the trainer runs it today, on one set of chips shared by sampler and trainer:
sample (decode-bound, with prompts prefilled once per query), then train (6·N + attention FLOPs
per token, PaLM's convention, `tirjax.train_steps.flops`), then hand the weights over (bf16
safetensors export and reload, spec §7). Rows of a query share its prompt (a prefix cache, as
vLLM's and the JAX sampler's); tool responses are prefilled as they arrive. The last column is
the same step with k-step off-policy rollouts (`train.max_staleness` >= 1) on the same chips
split between a sampler and a learner, step t + k sampled while step t trains: the best split,
its step time and its speed-up (`step_time.async_estimate`).
"""

from __future__ import annotations

from tirjax.reporting.step_time import (CHIPS, DECODE_BANDWIDTH_FRACTION, EPISODE_EFFICIENCY,
                                        HANDOVER_BYTES_PER_S, TRAIN_MFU, Workload,
                                        async_estimate, estimate, table)


def main(argv) -> None:
  from absl import app, flags  # pylint: disable=import-outside-toplevel
  f = flags.FLAGS
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if f.model:
    cases = [(Workload(model=f.model, queries=f.queries, rows=f.rows, context=f.context),
              CHIPS[f.chip], f.chips)]
  else:  # the papers' sizes
    cases = [(Workload(model=m, rows=r, context=c), CHIPS[chip], n)
             for m in ("qwen3_1p7b", "qwen3_8b") for r in (16, 8)
             for c in (8192, 32768) for chip, n in (("h200", 8), ("tpu_v5p", 16))]
  rows = []
  for w, chip, n in cases:
    row = estimate(w, chip, n)
    try:
      row["async"] = async_estimate(w, chip, n)
    except ValueError:  # one chip, or no split holds the weights
      row["async"] = None
    rows.append(row)
  print(table(rows))
  print("\nConstants: " + "; ".join(f"{c.name}: {c.source}" for c in CHIPS.values()) +
        f"; training MFU {TRAIN_MFU} (assumed, PaLM 46 %); decode at "
        f"{DECODE_BANDWIDTH_FRACTION} of peak HBM bandwidth (assumed); episode efficiency "
        f"{EPISODE_EFFICIENCY} (measured on the CPU, bench_rl_step_cpu.json); hand-over "
        f"{HANDOVER_BYTES_PER_S / 1e9:.0f} GB/s (assumed local NVMe).")


def define_flags() -> None:
  """The command's flags, defined when it runs (the module is also a library)."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  flags.DEFINE_string("model", None, "a preset (qwen3_1p7b, qwen3_8b, ...); none: the table")
  flags.DEFINE_integer("queries", 256, "queries per step")
  flags.DEFINE_integer("rows", 16, "rows per query")
  flags.DEFINE_integer("context", 8192, "tokens per row")
  flags.DEFINE_integer("chips", 8, "chips")
  flags.DEFINE_enum("chip", "h200", sorted(CHIPS), "chip kind")


if __name__ == "__main__":
  from tirjax import cli
  define_flags()
  cli.run(main)
