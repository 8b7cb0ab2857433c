"""Benchmark of the vLLM sampler on a tiny random Qwen3: start-up, throughput, hand-over.

    python -m benchmarks.bench_vllm --json=benchmarks/results/vllm_cpu.json [--time_env]

Launches one vLLM server (from `.venv-vllm`) of a tiny model saved by transformers, then
measures completion throughput (sampled tokens per second, no stop tokens) at each batch size,
and the weight hand-over (reload + prefix-cache reset + log-prob check against transformers).
With --time_env it also times `make vllm-env` into a throw-away directory (with uv's cache as
it is, and also empty with --cold_cache) and records its size. Prints one JSON object (and writes it
with --json); the machine's load average is recorded, since other work skews every timing.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
import time

import psutil
from absl import app, flags

from tirjax import cli
from tirjax.testing import tiny_hf
from tirjax.sampling.vllm import VLLMOptions, VLLMSampler
from tirjax.reporting import benchmark
from tirjax.sampling.throughput import throughput
from tirjax.sampling.vllm_server import ServerOptions

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def disk_bytes(path: str) -> int:
  return int(subprocess.run(["du", "-sb", path], capture_output=True, text=True,
                            check=True).stdout.split()[0])


def time_env(cold_cache: bool) -> dict:
  """Seconds and bytes of `make vllm-env` into a fresh directory."""
  with tempfile.TemporaryDirectory(prefix="bench-vllm-env-") as tmp:
    env = dict(os.environ)
    if cold_cache:
      env["UV_CACHE_DIR"] = os.path.join(tmp, "uv-cache")
    venv = os.path.join(tmp, "venv")
    t0 = time.monotonic()
    subprocess.run(["make", "-s", "vllm-env", f"VLLM_VENV={venv}"], cwd=REPO, env=env,
                   check=True)
    return {"seconds": round(time.monotonic() - t0, 1), "bytes": disk_bytes(venv),
            "uv_cache": "empty" if cold_cache else "as found"}


def pss_bytes(pids) -> int:
  """Proportional set size of the processes: shared libraries counted once over all."""
  total = 0
  for pid in pids:
    try:
      total += psutil.Process(pid).memory_full_info().pss
    except (psutil.NoSuchProcess, psutil.AccessDenied):
      pass
  return total


def handover(sampler, dirs, teachers, repeats: int) -> dict:
  reports = []
  for i in range(repeats):
    name = "b" if i % 2 == 0 else "a"
    t0 = time.monotonic()
    report = sampler.load_weights(dirs[name], teacher_logprobs=teachers[name])
    reports.append((time.monotonic() - t0, report))
  med = lambda xs: round(statistics.median(xs), 4)  # noqa: E731
  return {"total_s": med([t for t, _ in reports]),
          "reload_s": med([r.reload_s for _, r in reports]),
          "reset_prefix_cache_s": med([r.reset_s for _, r in reports]),
          "check_s": med([r.check_s for _, r in reports]),
          "max_logprob_gap": max(r.gap.max_abs for _, r in reports),
          "repeats": repeats}


_JSON = flags.DEFINE_string("json", None, "also write the results here")
_BATCHES = flags.DEFINE_list("batches", ["1", "16", "64"], "batch sizes timed")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 16, "prompt tokens", lower_bound=1)
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 64, "sampled tokens per row", lower_bound=1)
_REPEATS = flags.DEFINE_integer("repeats", 3, "timed repeats", lower_bound=1)
_KV_CACHE_MIB = flags.DEFINE_integer("kv_cache_mib", 16, "the server's KV cache", lower_bound=1)
_SERVER_ENV = flags.DEFINE_multi_string("server_env", [], "NAME=VALUE: an environment "
                                        "variable for the server (repeatable)")
_TIME_ENV = flags.DEFINE_boolean("time_env", False, "also time `make vllm-env`")
_COLD_CACHE = flags.DEFINE_boolean("cold_cache", False, "... and again with an empty uv cache")


def main(argv) -> dict:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  results = {"machine": benchmark.machine(jax_info=False)}
  if _TIME_ENV.value:
    results["make_vllm_env"] = [time_env(cold) for cold in [False] + [True] * _COLD_CACHE.value]
  venv = os.path.join(REPO, ".venv-vllm")
  if os.path.isdir(venv):
    results["venv_vllm_bytes"] = disk_bytes(venv)

  with tempfile.TemporaryDirectory(prefix="bench-vllm-") as tmp:
    dirs = {name: os.path.join(tmp, name) for name in ("a", "b")}
    teachers = {name: tiny_hf.torch_teacher(tiny_hf.save_model(path, seed=seed))
                for seed, (name, path) in enumerate(dirs.items())}
    options = ServerOptions(model=dirs["a"], max_model_len=512,
                            kv_cache_memory_bytes=_KV_CACHE_MIB.value * 2**20,
                            env=tuple(tuple(kv.split("=", 1)) for kv in _SERVER_ENV.value))
    results["model"] = {"spec": str(tiny_hf.TinyQwen3()), "dtype": options.dtype,
                        "kv_cache_bytes": options.kv_cache_memory_bytes,
                        "server_env": dict(options.env)}
    with VLLMSampler(VLLMOptions(server=options)) as sampler:
      results["startup_s"] = round(sampler.server.startup_s, 1)
      results["server_pss_bytes_idle"] = pss_bytes(sampler.server.pids())
      results["throughput"] = [
          throughput(sampler, int(b), _PROMPT_LEN.value, _NEW_TOKENS.value, _REPEATS.value,
                     tiny_hf.TinyQwen3().vocab_size)
          for b in _BATCHES.value]
      results["throughput_setup"] = {"prompt_len": _PROMPT_LEN.value,
                                     "new_tokens": _NEW_TOKENS.value, "temperature": 1.0}
      results["server_pss_bytes_loaded"] = pss_bytes(sampler.server.pids())
      results["handover"] = handover(sampler, dirs, teachers, repeats=4)
  print(benchmark.write_result(_JSON.value, results))
  return results


if __name__ == "__main__":
  cli.run(main)
