"""Benchmark: the built-in JAX sampler's throughput, the cost of tree rollouts, and vLLM's
throughput and hand-over time next to the JAX sampler's.

  python -m experiments.bench_sampler --json=benchmarks/results/bench_sampler_cpu.json
  python -m experiments.bench_sampler --sections=vllm --repeats=9 \
      --json=benchmarks/results/bench_sampler_vllm_cpu.json

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

Each section records the machine (CPU model, cores, jax version, load average before and
after): other work on a shared machine skews every timing.

* `vllm`: vLLM-cpu (`tirjax.sampling.vllm`, a server from vLLM's own environment, see the
  README's "vLLM sampler") against `JaxSampler` on the same model and the same prompts: the
  `tiny` preset over the toolworld vocabulary with head size `TINY_HEAD_DIM` (vLLM's CPU
  attention lacks the preset's 16), exported with `export_hf` in float32. Tokens per second of
  both at `--batches` (protocol of `jax`; vLLM gets one untimed warm-up call too), their ratio,
  the server's start-up, and the time of one weight hand-over as the trainer does it
  (`export_hf` of perturbed weights, `reload_weights`, prefix-cache reset, log-prob check
  against tirjax's `DecoderTeacher`): the median of `--handover_repeats`, after an untimed
  one that compiles the teacher. The check's measured log-prob gaps are recorded too.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
import time

import jax
import numpy as np
import transformers
from absl import app, flags
from flax import nnx

from tirjax.env import chat
from tirjax.env.toolworld import build_tokenizer, make_tasks
from tirjax.models import config, decoder
from tirjax.models.hf_io import export_hf
from tirjax.episodes import RolloutOptions, Shapes, TreeOptions, time_modes
from tirjax.sampling.interface import Sampler, SamplingParams
from tirjax.sampling.jax_sampler import JaxSampler, JaxSamplerOptions, bucket
from tirjax.sampling.teacher import DecoderTeacher
from tirjax.sampling.vllm import TINY_HEAD_DIM, VLLMOptions, VLLMSampler
from tirjax.reporting import benchmark
from tirjax.sampling.vllm_server import ServerOptions

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
_HANDOVER_REPEATS = flags.DEFINE_integer("handover_repeats", 3, "vllm: timed hand-overs")
_VLLM_KV_MIB = flags.DEFINE_integer("vllm_kv_cache_mib", 64, "vllm: the server's KV cache")
_PRESET = flags.DEFINE_string("preset", "tiny", "jax section: model preset (tiny, or "
                              "qwen3_0p6b / qwen3_1p7b sizes with random bf16 weights)")
_TOKENIZER_DIR = flags.DEFINE_string("tokenizer_dir", "/tmp/tirjax_bench_tokenizer",
                                     "where the toolworld tokenizer is built")


def throughput(sampler: Sampler, batch: int, prompt_len: int, new_tokens: int, repeats: int,
               vocab_size: int) -> dict:
  """Generated tokens per second of `sampler.generate` at `batch` rows (median of `repeats`
  calls after one untimed call). Any `Sampler`: the vLLM section uses it too."""
  rng = np.random.default_rng(batch)
  prompts = rng.integers(0, vocab_size, size=(batch, prompt_len)).tolist()
  params = SamplingParams(max_new_tokens=new_tokens, seed=0)
  sampler.generate(prompts, params)  # compiles / warms the path
  rates, times = [], []
  for _ in range(repeats):
    t0 = time.perf_counter()
    out = sampler.generate(prompts, params)
    seconds = time.perf_counter() - t0
    tokens = sum(len(s.tokens) for g in out for s in g)
    rates.append(tokens / seconds)
    times.append(seconds)
  return {"batch": batch, "tokens_per_s": statistics.median(rates),
          "tokens_per_call": tokens, "seconds_all": times, "tokens_per_s_all": rates}


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


def _vllm_version(python: str) -> str:
  """The installed vLLM distribution of that interpreter's environment (without importing it)."""
  code = ("import importlib.metadata as m\n"
          "for d in ('vllm-cpu', 'vllm'):\n"
          "  try: print(d, m.version(d)); break\n"
          "  except m.PackageNotFoundError: pass")
  return subprocess.run([python, "-c", code], capture_output=True, text=True,
                        check=True).stdout.strip()


def _handover(sampler: VLLMSampler, teacher: DecoderTeacher, model, tokenizer_dir: str,
              out_dir: str, seed: int) -> dict:
  """One hand-over of `model`'s weights plus N(0, 0.01²) noise, timed part by part."""
  graphdef, params = nnx.split(model)
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  params = jax.tree.unflatten(tree, [x + 0.01 * jax.random.normal(k, x.shape, x.dtype)
                                     for x, k in zip(leaves, keys)])
  t0 = time.perf_counter()
  export_hf(nnx.merge(graphdef, params), out_dir, source_dir=tokenizer_dir, dtype="float32",
            overwrite=True)
  export_s = time.perf_counter() - t0
  teacher.set_params(params)
  report = sampler.load_weights(out_dir, teacher_logprobs=teacher)
  return {"export_s": export_s, "reload_s": report.reload_s, "reset_s": report.reset_s,
          "check_s": report.check_s,
          "total_s": export_s + report.reload_s + report.reset_s + report.check_s,
          "gap_max": report.gap.max_abs, "gap_mean": report.gap.mean_abs,
          "gap_tokens": report.gap.num_tokens}


def vllm_section(tokenizer) -> dict:
  info = benchmark.machine()
  cfg = config.tiny(vocab_size=len(tokenizer), head_dim=TINY_HEAD_DIM)
  model = decoder.init(cfg)
  tokenizer_dir = str(build_tokenizer(_TOKENIZER_DIR.value))
  jax_sampler = JaxSampler(model, JaxSamplerOptions())
  with tempfile.TemporaryDirectory(prefix="bench-sampler-vllm-") as tmp:
    start = export_hf(model, os.path.join(tmp, "start"), source_dir=tokenizer_dir,
                      dtype="float32")
    server = ServerOptions(model=start, max_model_len=_PROMPT_LEN.value + _NEW_TOKENS.value,
                           kv_cache_memory_bytes=_VLLM_KV_MIB.value << 20)
    with VLLMSampler(VLLMOptions(server=server)) as sampler:
      results = []
      for b in map(int, _BATCHES.value):
        jax_sampler.precompile(b, _PROMPT_LEN.value, _NEW_TOKENS.value)
        run = {name: throughput(s, b, _PROMPT_LEN.value, _NEW_TOKENS.value, _REPEATS.value,
                                cfg.vocab_size)
               for name, s in (("jax", jax_sampler), ("vllm", sampler))}
        ratio = run["vllm"]["tokens_per_s"] / run["jax"]["tokens_per_s"]
        results.append({"batch": b, **run, "vllm_over_jax": ratio})
        print(f"batch {b}: vllm {run['vllm']['tokens_per_s']:.0f}, jax "
              f"{run['jax']['tokens_per_s']:.0f} tokens/s (ratio {ratio:.2f})", flush=True)
      teacher = DecoderTeacher.of(model, chunk_size=256)
      handovers = [_handover(sampler, teacher, model, tokenizer_dir, os.path.join(tmp, "w"), k)
                   for k in range(_HANDOVER_REPEATS.value + 1)]
      timed = handovers[1:]
      print(f"hand-over: {statistics.median(h['total_s'] for h in timed):.2f} s, gap up to "
            f"{max(h['gap_max'] for h in handovers):.2g}", flush=True)
      startup_s = sampler.server.startup_s
      version = _vllm_version(server.python)
  info["load_average_end"] = list(os.getloadavg())
  return {"machine": info, "vllm": version,
          "model": {"preset": "tiny", "vocab_size": cfg.vocab_size, "head_dim": cfg.head_dim,
                    "dtype": "float32"},
          "server": {"startup_s": startup_s, "max_model_len": server.max_model_len,
                     "kv_cache_mib": _VLLM_KV_MIB.value, "enforce_eager": server.enforce_eager,
                     "enable_prefix_caching": server.enable_prefix_caching},
          "setup": {"prompt_len": _PROMPT_LEN.value, "new_tokens": _NEW_TOKENS.value,
                    "temperature": 1.0, "top_p": 1.0, "repeats": _REPEATS.value,
                    "same_prompts": True},
          "throughput": results,
          "handover": {"median_total_s": statistics.median(h["total_s"] for h in timed),
                       "median_export_s": statistics.median(h["export_s"] for h in timed),
                       "median_reload_s": statistics.median(h["reload_s"] for h in timed),
                       "median_check_s": statistics.median(h["check_s"] for h in timed),
                       "max_gap": max(h["gap_max"] for h in handovers),
                       "warmup": handovers[0], "timed": timed}}


def _powers(lo: int, hi: int) -> list[int]:
  """Powers of two from lo to hi (both powers of two)."""
  return [1 << k for k in range(lo.bit_length() - 1, hi.bit_length())]


SECTIONS = {"jax": jax_section, "tree_vs_independent": tree_section, "vllm": vllm_section}


def main(argv):
  del argv
  unknown = set(_SECTIONS.value) - set(SECTIONS)
  if unknown:
    raise app.UsageError(f"--sections: unknown {sorted(unknown)}; known: {sorted(SECTIONS)}")
  tokenizer = toolworld_tokenizer()
  results = {}
  if _JSON.value and os.path.exists(_JSON.value):
    with open(_JSON.value) as f:
      results = json.load(f)
  results["benchmark"] = "bench_sampler"
  sections = results.setdefault("sections", {})
  for name in _SECTIONS.value:
    sections[name] = SECTIONS[name](tokenizer)
  print(benchmark.write_result(_JSON.value, results))


if __name__ == "__main__":
  app.run(main)
