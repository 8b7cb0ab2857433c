"""Benchmark: the built-in JAX sampler's throughput and the cost of tree rollouts.

  python -m benchmarks.bench_sampler --json=benchmarks/results/bench_sampler_cpu.json

Sections (`--sections`, each written under its name into the JSON file, other sections of an
existing file kept):

* `jax`: generated tokens per second of `JaxSampler` on the `tiny` preset (vocabulary of the
  toolworld tokenizer) at `--batches` rows, each prompt `--prompt_len` tokens and exactly
  `--new_tokens` new tokens (temperature 1, no stop tokens). The first call of each batch size
  compiles its bucket and is not timed; the median of `--repeats` calls is reported.
* `tree_vs_independent`: wall time of PORTool's tree rollouts against independent rollouts at
  equal n on toolworld, with that sampler (`tirjax.episodes.timing.time_modes`). Every bucket
  the rollouts can use is compiled first, so no timed run compiles. The model's weights are
  random: rows never answer and run to T_max (or are truncated), which is the most sampling
  either mode can do.
* `vllm_comparison`: measures nothing. It sets the `jax` section (of this run, or kept in the
  JSON file) beside vLLM's throughput from `--vllm_result`, the file `benchmarks.bench_vllm`
  writes (vLLM's numbers, start-up and hand-over are that benchmark's), at the batch sizes
  both measured. The two models are alike in size, not the same (see `models`); the ratio is
  like for like only where `same_setup` (prompt and new tokens per row) holds.

Each measured section records the machine (CPU model, cores, jax version, load average before
and after): other work on a shared machine skews every timing.
"""

from __future__ import annotations

import json
import os
import time

import transformers
from absl import app, flags

from tirjax import cli
from tirjax.env import chat
from tirjax.env.toolworld import build_tokenizer, make_tasks
from tirjax.models import config, decoder
from tirjax.episodes import RolloutOptions, Shapes, TreeOptions, time_modes
from tirjax.sampling.jax_sampler import JaxSampler, JaxSamplerOptions, bucket
from tirjax.sampling.throughput import throughput
from tirjax.reporting import benchmark

_JSON = flags.DEFINE_string("json", None, "merge the sections into this JSON file")
_SECTIONS = flags.DEFINE_list("sections", ["jax", "tree_vs_independent"], "sections to run")
_BATCHES = flags.DEFINE_list("batches", ["1", "16", "64"], "rows per call")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 64, "tokens per prompt")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 128, "tokens generated per row")
_REPEATS = flags.DEFINE_integer("repeats", 5, "timed calls (median reported)")
_TASKS = flags.DEFINE_integer("tasks", 4, "toolworld queries per rollout batch")
_N = flags.DEFINE_integer("n", 8, "rows per query (both modes)")
_BRANCH = flags.DEFINE_integer("branch_factor", 2, "tree: candidates per active node (f)")
_MAX_STEPS = flags.DEFINE_integer("max_steps", 4, "T_max")
_STEP_TOKENS = flags.DEFINE_integer("step_tokens", 32, "max_new_tokens per step")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 1024, "tokens per row (shapes.max_tokens)")
_ROLLOUT_REPEATS = flags.DEFINE_integer("rollout_repeats", 3, "timed rollouts per mode")
_VLLM_RESULT = flags.DEFINE_string("vllm_result", "benchmarks/results/vllm_cpu.json",
                                   "vllm_comparison: benchmarks.bench_vllm's result file")
_PRESET = flags.DEFINE_string("preset", "tiny", "jax section: model preset (tiny, or "
                              "qwen3_0p6b / qwen3_1p7b sizes with random bf16 weights)")
_TOKENIZER_DIR = flags.DEFINE_string("tokenizer_dir", "/tmp/tirjax_bench_tokenizer",
                                     "where the toolworld tokenizer is built")


def toolworld_tokenizer():
  return transformers.AutoTokenizer.from_pretrained(
      str(build_tokenizer(_TOKENIZER_DIR.value)))


def jax_section(tokenizer) -> dict:
  info = benchmark.machine()
  cfg = (config.tiny(vocab_size=len(tokenizer)) if _PRESET.value == "tiny" else
         config.preset(_PRESET.value, dtype="bfloat16", param_dtype="bfloat16"))
  options = JaxSamplerOptions()
  sampler = JaxSampler(decoder.init(cfg), options)
  results = []
  for b in map(int, _BATCHES.value):
    t0 = time.perf_counter()
    sampler.precompile(b, _PROMPT_LEN.value, _NEW_TOKENS.value)
    compile_s = time.perf_counter() - t0
    r = throughput(sampler, b, _PROMPT_LEN.value, _NEW_TOKENS.value, _REPEATS.value,
                   cfg.vocab_size)
    r.update(bucket=sampler.bucket_for(b, _PROMPT_LEN.value, _NEW_TOKENS.value)._asdict(),
             compile_s=compile_s)
    results.append(r)
    print(f"jax batch {b}: {r['tokens_per_s']:.0f} tokens/s (compile {compile_s:.1f} s)",
          flush=True)
  info["load_average_end"] = list(os.getloadavg())
  return {"machine": info, "model": {"preset": _PRESET.value, "vocab_size": cfg.vocab_size,
                                     "dtype": cfg.dtype},
          "options": {k: getattr(options, k) for k in options.__dataclass_fields__},
          "setup": {"prompt_len": _PROMPT_LEN.value, "new_tokens": _NEW_TOKENS.value,
                    "temperature": 1.0, "top_p": 1.0, "repeats": _REPEATS.value},
          "compiled_buckets": len(sampler.compiled_buckets), "throughput": results}


def tree_section(tokenizer) -> dict:
  info = benchmark.machine()
  cfg = config.tiny(vocab_size=len(tokenizer))
  sampler = JaxSampler(decoder.init(cfg))
  n, f, tasks = _N.value, _BRANCH.value, make_tasks("train", _TASKS.value, seed=0)
  shapes = Shapes(num_rows=len(tasks) * n, max_steps=_MAX_STEPS.value,
                  max_tokens=_MAX_TOKENS.value)
  options = RolloutOptions(n=n, max_steps=_MAX_STEPS.value, max_new_tokens=_STEP_TOKENS.value,
                           tree=TreeOptions(branch_factor=f), shapes=shapes)
  # Every bucket a call can fall in: the first call (n rows per query), then a active rows
  # with one sample each (independent) or f (tree), contexts up to shapes.max_tokens.
  o = sampler.options
  shortest = min(len(chat.render_prompt_ids(tokenizer, t, t.question)) for t in tasks)
  calls = {(len(tasks) * n, len(tasks))}
  calls |= {(a * k, a) for a in range(1, len(tasks) * n + 1) for k in (1, f)}
  lengths = _powers(bucket(shortest, o.min_prompt_len), bucket(_MAX_TOKENS.value,
                                                               o.min_prompt_len))
  t0 = time.perf_counter()
  for rows, prompts in sorted(calls):
    for length in lengths:
      sampler.precompile(rows, length, _STEP_TOKENS.value, prompts=prompts)
  compile_s = time.perf_counter() - t0
  before = len(sampler.compiled_buckets)
  modes = time_modes(sampler, tokenizer, tasks, options, repeats=_ROLLOUT_REPEATS.value)
  info["load_average_end"] = list(os.getloadavg())
  tree, ind = modes["tree"], modes["independent"]
  return {"machine": info,
          "options": {"tasks": len(tasks), "n": n, "branch_factor": f,
                      "max_steps": _MAX_STEPS.value, "max_new_tokens": _STEP_TOKENS.value,
                      "max_tokens": _MAX_TOKENS.value, "temperature": options.temperature},
          "precompile_s": compile_s, "compiled_buckets": before,
          "compiled_while_timing": len(sampler.compiled_buckets) - before,
          "modes": modes,
          "tree_over_independent": {
              "wall_s": tree["wall_s"] / ind["wall_s"],
              "sampled_tokens": tree["sampled_tokens"] / ind["sampled_tokens"],
              "sampler_calls": tree["sampler_calls"] / ind["sampler_calls"]}}


def _powers(lo: int, hi: int) -> list[int]:
  """Powers of two from lo to hi (both powers of two)."""
  return [1 << k for k in range(lo.bit_length() - 1, hi.bit_length())]


def _compare_section(sections: dict) -> dict:
  if "jax" not in sections:
    raise app.UsageError("--sections=vllm_comparison needs the jax section: run it too, or "
                         "give --json a file that holds one")
  with open(_VLLM_RESULT.value) as f:
    return benchmark.sampler_comparison(sections["jax"], json.load(f), _VLLM_RESULT.value)


SECTIONS = {"jax": jax_section, "tree_vs_independent": tree_section}
READ_SECTIONS = {"vllm_comparison": _compare_section}  # from result files, after the others


def main(argv):
  del argv
  known = set(SECTIONS) | set(READ_SECTIONS)
  unknown = set(_SECTIONS.value) - known
  if unknown:
    raise app.UsageError(f"--sections: unknown {sorted(unknown)}; known: {sorted(known)} "
                         "(vLLM's own numbers: benchmarks.bench_vllm)")
  measured = [name for name in _SECTIONS.value if name in SECTIONS]
  tokenizer = toolworld_tokenizer() if measured else None
  results = {}
  if _JSON.value and os.path.exists(_JSON.value):
    with open(_JSON.value) as f:
      results = json.load(f)
  results["benchmark"] = "bench_sampler"
  sections = results.setdefault("sections", {})
  for name in measured:
    sections[name] = SECTIONS[name](tokenizer)
  for name in _SECTIONS.value:
    if name in READ_SECTIONS:
      sections[name] = READ_SECTIONS[name](sections)
  print(benchmark.write_result(_JSON.value, results))


if __name__ == "__main__":
  cli.run(main)
