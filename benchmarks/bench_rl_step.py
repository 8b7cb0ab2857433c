"""The RL step of the tiny default, phase by phase, with the JAX sampler's prefix cache on and
off at equal work (same config, seed and warm start: the same sampled tokens), and with the
vLLM sampler beside them (vLLM's automatic prefix caching on; its own sampling, so not the
same tokens).

    python -m benchmarks.bench_rl_step --hf_checkpoint=runs/default_bench/seed0/hf_export \\
        --json=benchmarks/results/bench_rl_step_cpu.json

Each variant is a fresh `experiments.train` run of `--steps` RL steps from the checkpoint (no
SFT, no evaluation); the first `--skip` steps (compilation) are left out of the medians. Also
measured: the sampler's raw decode throughput at the same batch (rows that never stop, no
tool turns), against which the episodes' generated tokens per second of sampler time are set.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import numpy as np
from absl import app, flags

from tirjax import cli
from tirjax.reporting import benchmark, launch, rl_step
from tirjax.rundir import RunDir

flags.DEFINE_string("hf_checkpoint", None, "Warm start: an HF export of the tiny model.")
flags.DEFINE_string("config", "configs/hidifftir.py:model=tiny", "The run config.")
flags.DEFINE_integer("steps", 12, "RL steps per variant.")
flags.DEFINE_integer("skip", 2, "First steps left out of the medians (compilation).")
flags.DEFINE_string("workdir", "runs/bench_rl_step", "Parent of the variants' run directories.")
flags.DEFINE_string("json", "benchmarks/results/bench_rl_step_cpu.json", "Results.")
flags.DEFINE_list("variants", ["re-prefill", "prefix cache", "vllm"], "Which variants run.")
flags.DEFINE_string("reanalyse", None, "Recompute the `limits` of this result file (no run).")
flags.register_multi_flags_validator(
    ["hf_checkpoint", "reanalyse"], lambda f: bool(f["hf_checkpoint"] or f["reanalyse"]),
    "--hf_checkpoint is required (unless --reanalyse)")
FLAGS = flags.FLAGS

VARIANTS = {"re-prefill": ["--config.sampler.reuse_cache=False"],
            "prefix cache": ["--config.sampler.reuse_cache=True"],
            "vllm": ["--config.sampler.kind=vllm"]}


def variant_workdir(name: str) -> str:
  return os.path.join(FLAGS.workdir, name.replace(" ", "_"))


def run_variant(name: str, overrides: list) -> dict:
  run = launch.train(FLAGS.config, variant_workdir(name), [
      f"--config.model.hf_checkpoint={FLAGS.hf_checkpoint}", "--config.sft.steps=0",
      f"--config.train.steps={FLAGS.steps}", "--config.train.eval_at_start=False",
      "--config.env.eval_tasks=1", "--config.train.export_final=False",
      "--config.train.progress_bar=False", *overrides])
  rows = run.files.metrics("rl")[FLAGS.skip:]
  keys = sorted({k for r in rows for k in r if k.startswith(("time/", "tokens/"))})
  med = {k: statistics.median(r[k] for r in rows if k in r) for k in keys}
  step = {k: med[k] for k in med if k.startswith("time/") and k.split("/")[1] in (
      "handover_s", "rollout_s", "advantages_s", "reference_s", "update_s")}
  med["time/step_s"] = sum(step.values())
  med["sampled_tokens"] = [r["rollout/sampled_tokens"] for r in rows]
  # vLLM reports no prefill/decode split: its generated tokens are the sampled ones.
  generated = med.get("tokens/decode") or statistics.median(med["sampled_tokens"])
  med["episode_tokens_per_s"] = generated / med["time/sampler_s"]
  return med


def raw_decode(rows: int) -> float:
  """Generated tokens per second of decode time: `rows` rows of 300 prompt tokens that never
  stop, 64 new tokens each, no prefix cache (the sampler's own throughput at that batch)."""
  from tirjax.models.hf_io import load_hf
  from tirjax.sampling.interface import SamplingParams
  from tirjax.sampling.jax_sampler import JaxSampler, JaxSamplerOptions
  bucket_rows = 1 << max(rows - 1, 0).bit_length()  # the power-of-two bucket episodes use
  sampler = JaxSampler(load_hf(FLAGS.hf_checkpoint), JaxSamplerOptions(
      min_batch=bucket_rows, min_prompts=1, max_batch=256, min_prompt_len=512, min_new_tokens=64,
      reuse_cache=False))
  rng = np.random.default_rng(0)
  prompts = [rng.integers(5, 300, size=300).tolist() for _ in range(rows)]
  params = SamplingParams(max_new_tokens=64, seed=0)
  sampler.generate(prompts, params)  # compile
  before = dict(sampler.counters)
  for seed in range(3):
    sampler.generate(prompts, SamplingParams(max_new_tokens=64, seed=seed))
  return ((sampler.counters["decode_tokens"] - before["decode_tokens"]) /
          (sampler.counters["decode_s"] - before["decode_s"]))


def main(argv):
  del argv
  if FLAGS.reanalyse:  # the limits of a result file already measured, recomputed in place
    with open(FLAGS.reanalyse) as f:
      out = json.load(f)
    out["limits"] = rl_step.limits(out)
    with open(FLAGS.reanalyse, "w") as f:  # the measurement's own machine record stays as is
      json.dump(out, f, indent=1)
    print(json.dumps(out["limits"], indent=1))
    return
  info = benchmark.machine()
  start = time.perf_counter()
  unknown = sorted(set(FLAGS.variants) - set(VARIANTS))
  if unknown:
    raise app.UsageError(f"--variants: unknown {unknown}; known: {sorted(VARIANTS)}")
  results = {name: run_variant(name, VARIANTS[name]) for name in FLAGS.variants}
  rows = RunDir(variant_workdir(FLAGS.variants[0])).config()["rollout"]["shapes"]["num_rows"]
  raw = raw_decode(rows)
  out = dict(
      command="python -m benchmarks.bench_rl_step " + " ".join(sys.argv[1:]),
      machine=info, config=FLAGS.config, rows_per_step=rows, variants=results,
      raw_decode_tokens_per_s=raw)
  if "re-prefill" in results and "prefix cache" in results:
    old, new = results["re-prefill"], results["prefix cache"]
    out.update(same_sampled_tokens=old["sampled_tokens"] == new["sampled_tokens"],
               step_speedup=old["time/step_s"] / new["time/step_s"],
               rollout_speedup=old["time/rollout_s"] / new["time/rollout_s"],
               episode_efficiency=new["episode_tokens_per_s"] / raw)
    out["limits"] = rl_step.limits(out)
  if "vllm" in results and "prefix cache" in results:
    v, new = results["vllm"], results["prefix cache"]
    out.update(vllm_step_over_prefix_cache=v["time/step_s"] / new["time/step_s"],
               vllm_rollout_over_prefix_cache=v["time/rollout_s"] / new["time/rollout_s"],
               vllm_episode_tokens_per_s=v["episode_tokens_per_s"])
  out["seconds"] = round(time.perf_counter() - start, 1)
  benchmark.write_result(FLAGS.json, out, indent=1)
  print(json.dumps({k: v for k, v in out.items() if k != "variants"}, indent=1))


if __name__ == "__main__":
  cli.run(main)
