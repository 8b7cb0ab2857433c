"""benchmarks.bench_sampler's `vllm_comparison` section (`benchmark.sampler_comparison`): the
JAX sampler's throughput beside the vLLM numbers of benchmarks.bench_vllm's result file, read,
never measured again; and the throughput measure both benchmarks share."""

import json
import os
import statistics
import subprocess
import sys

import numpy as np
import pytest

from tirjax.reporting import benchmark
from tirjax.sampling.interface import Sample
from tirjax.sampling.throughput import throughput

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MACHINE = {"cpu": "Some CPU", "cpus": 2, "platform": "Linux"}
JAX = {"machine": MACHINE, "model": {"preset": "tiny", "vocab_size": 1536, "dtype": "float32"},
       "setup": {"prompt_len": 16, "new_tokens": 64, "temperature": 1.0},
       "throughput": [{"batch": 1, "tokens_per_s": 100.0}, {"batch": 16, "tokens_per_s": 800.0},
                      {"batch": 32, "tokens_per_s": 1000.0}]}
VLLM = {"machine": {"cpus": 2, "platform": "Linux"}, "model": {"spec": "TinyQwen3(...)"},
        "throughput": [{"batch": 1, "tokens_per_s": 50.0}, {"batch": 16, "tokens_per_s": 1200.0},
                       {"batch": 64, "tokens_per_s": 3000.0}],
        "throughput_setup": {"prompt_len": 16, "new_tokens": 64, "temperature": 1.0}}


def test_the_comparison_pairs_the_batches_both_measured():
  comparison = benchmark.sampler_comparison(JAX, VLLM, "vllm.json")
  assert comparison["source"] == "vllm.json" and comparison["same_setup"]
  assert comparison["throughput"] == [
      {"batch": 1, "jax_tokens_per_s": 100.0, "vllm_tokens_per_s": 50.0, "vllm_over_jax": 0.5},
      {"batch": 16, "jax_tokens_per_s": 800.0, "vllm_tokens_per_s": 1200.0,
       "vllm_over_jax": 1.5}]
  assert comparison["models"] == {"jax": JAX["model"], "vllm": "TinyQwen3(...)"}
  assert comparison["machines"] == {"jax": MACHINE,
                                    "vllm": {"cpu": None, "cpus": 2, "platform": "Linux"}}


def test_other_setups_are_flagged():
  other = {**VLLM, "throughput_setup": {"prompt_len": 64, "new_tokens": 64}}
  comparison = benchmark.sampler_comparison(JAX, other, "vllm.json")
  assert comparison["same_setup"] is False
  assert comparison["setup"] == {"jax": {"prompt_len": 16, "new_tokens": 64},
                                 "vllm": {"prompt_len": 64, "new_tokens": 64}}


def test_a_file_that_is_not_bench_vllms_is_refused_by_name():
  with pytest.raises(ValueError, match="other.json: not an benchmarks.bench_vllm result"):
    benchmark.sampler_comparison(JAX, {"sections": {}}, "other.json")


def bench(tmp_path, sections, result):
  paths = {name: str(tmp_path / f"{name}.json") for name in ("result", "vllm")}
  for name, data in (("result", result), ("vllm", VLLM)):
    with open(paths[name], "w") as f:
      json.dump(data, f)
  proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_sampler",
                         f"--sections={sections}", f"--json={paths['result']}",
                         f"--vllm_result={paths['vllm']}"],
                        capture_output=True, text=True, cwd=ROOT, timeout=600)
  with open(paths["result"]) as f:
    return proc, json.load(f)


@pytest.mark.slow
def test_the_section_reads_both_files_and_the_vllm_section_is_gone(tmp_path):
  proc, out = bench(tmp_path, "vllm_comparison", {"sections": {"jax": JAX}})
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert out["sections"] == {"jax": JAX, "vllm_comparison": benchmark.sampler_comparison(
      JAX, VLLM, str(tmp_path / "vllm.json"))}
  proc, _ = bench(tmp_path, "vllm", {"sections": {"jax": JAX}})
  assert proc.returncode != 0
  assert "unknown ['vllm']" in proc.stderr and "benchmarks.bench_vllm" in proc.stderr


class _CountingSampler:
  """Returns `new_tokens` tokens per row; records every call's prompts."""

  def __init__(self):
    self.calls = []

  def generate(self, prompts, params):
    self.calls.append(prompts)
    n = params.max_new_tokens
    return [[Sample(tokens=[1] * n, logprobs=[0.0] * n, finish_reason="length")]
            for _ in prompts]


def test_throughput_times_the_repeats_after_one_untimed_call_of_the_same_shape():
  """The one throughput measure of both sampler benchmarks (issue 39)."""
  sampler = _CountingSampler()
  r = throughput(sampler, batch=3, prompt_len=5, new_tokens=7, repeats=4, vocab_size=10)
  assert len(sampler.calls) == 5 and all(c == sampler.calls[0] for c in sampler.calls)
  assert np.shape(sampler.calls[0]) == (3, 5) and 2 <= np.min(sampler.calls[0])
  assert np.max(sampler.calls[0]) < 10
  assert r["tokens_per_call"] == 21 and len(r["tokens_per_s_all"]) == 4
  assert r["tokens_per_s"] == statistics.median(r["tokens_per_s_all"])
  assert r["tokens_per_s_all"] == [21 / s for s in r["seconds_all"]]
  with pytest.raises(ValueError, match="repeats"):
    throughput(sampler, batch=3, prompt_len=5, new_tokens=7, repeats=0, vocab_size=10)
