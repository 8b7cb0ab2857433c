"""Benchmark: tokens per second and peak memory of the policy train step, per model and mesh.

  python -m benchmarks.bench_train_step --json=benchmarks/results/bench_train_step_cpu.json
  python -m benchmarks.bench_train_step --gpu \
      --json=benchmarks/results/bench_train_step_gpu.json

CPU mode (default): 8 simulated CPU devices, meshes (data, fsdp, tensor) = (1,1,1), (8,1,1),
(2,2,2), (2,4,1), for the `tiny` preset and `qwen3_97m`, a scaled-down Qwen3 (Qwen3's
vocabulary and layer layout; width 512, SwiGLU 1536, 5 layers, 8 query / 4 key-value heads of
128, tied embedding: 97.5M parameters, 77.8M of them the embedding). One step = forward,
backward and AdamW update of the whole batch (micro-batched), as `train_steps.policy_step` runs
it.

GPU mode (`--gpu`): a Qwen3-1.7B-sized model (`qwen3_1p7b`, float32 master weights, bfloat16
compute, remat) on all GPUs (default mesh: every GPU on fsdp), and model FLOPs utilisation
against the chips' peak (`--peak_tflops`, per chip; default from the device kind).

Per case: compile time; step time (median of `--repeats` after one warm-up) and tokens per
second; per-device memory from XLA's compiled memory analysis (arguments + outputs + temporaries
− aliased (donated) bytes; CPU has no allocator statistics); model FLOPs per step
(`tirjax.train_steps.flops`: 6·N + attention, PaLM's convention) and achieved model FLOP/s; MFU
where a peak is known. Simulated devices share the host's memory: a case whose devices together
would need more than `--host_memory_budget_gib` is compiled and analysed but not run.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from absl import flags  # noqa: E402

from tirjax import cli, loss, sharding, train_steps  # noqa: E402
from tirjax.reporting import benchmark  # noqa: E402
from tirjax.models import config, decoder  # noqa: E402
from tirjax.train_steps import flops  # noqa: E402

_JSON = flags.DEFINE_string("json", None, "write results here")
_GPU = flags.DEFINE_bool("gpu", False, "GPU mode: qwen3_1p7b on all GPUs, with MFU")
_PRESETS = flags.DEFINE_list("presets", None, "model presets (default: tiny,qwen3_97m on CPU; "
                             "qwen3_1p7b on GPU)")
_MESHES = flags.DEFINE_list("meshes", None, "DxFxT meshes (default: 1x1x1,8x1x1,2x2x2,2x4x1 on "
                            "CPU; 1xNx1 over the N GPUs)")
_ROWS = flags.DEFINE_integer("rows", None, "rows per step (default 16 CPU, 32 GPU)")
_LENGTH = flags.DEFINE_integer("length", None, "tokens per row (default 128 CPU, 2048 GPU)")
_MICRO = flags.DEFINE_integer("microbatches", None, "micro-batches per step (default 2 CPU, "
                               "8 GPU)")
_CHUNK = flags.DEFINE_integer("chunk_size", 256, "log-prob chunk (positions per logits block)")
_REPEATS = flags.DEFINE_integer("repeats", 3, "timed steps per case (after one warm-up)")
_PEAK = flags.DEFINE_float("peak_tflops", None, "peak dense TFLOP/s per chip for MFU (GPU "
                           "default: from the device kind, bfloat16)")
_FIT = flags.DEFINE_bool("fit_microbatch", False, "find and time the largest micro-batch whose "
                         "compiled peak memory fits the device (one micro-batch per step)")
_FIT_GIB = flags.DEFINE_float("fit_budget_gib", None, "memory per device to fit into (default: "
                              "the device's allocator limit × 0.92; CPU: 2 GiB)")
_BUDGET = flags.DEFINE_float("host_memory_budget_gib", 8.0, "CPU: run a case only if its "
                             "simulated devices together need at most this much memory")

# Dense bfloat16 peak per chip (vendor data sheets, SXM parts).
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "B200": 2250.0}


def model_config(name: str) -> config.ModelConfig:
  if name == "qwen3_97m":
    return config.ModelConfig(
        family="qwen3", vocab_size=151936, hidden_size=512, intermediate_size=1536,
        num_layers=5, num_heads=8, num_kv_heads=4, head_dim=128, rope_theta=1e6,
        rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=40960)
  if name in ("qwen3_0p6b", "qwen3_1p7b") and _GPU.value:
    return config.preset(name, param_dtype="float32", dtype="bfloat16", remat=True)
  return config.preset(name)


def policy_batch(rows: int, length: int, vocab: int, seed: int = 0) -> train_steps.PolicyBatch:
  """Full rows: a quarter prompt, the rest generated; random advantages and old log-probs."""
  rng = np.random.default_rng(seed)
  valid = np.ones((rows, length), bool)
  loss_mask = valid & (np.arange(length)[None] >= length // 4)
  return train_steps.PolicyBatch(
      tokens=rng.integers(0, vocab, (rows, length)).astype(np.int32), token_valid=valid,
      loss_mask=loss_mask,
      old_logprobs=(-np.log(vocab) + rng.normal(0, 0.3, (rows, length))).astype(np.float32),
      advantages=np.where(loss_mask, rng.normal(0, 1, (rows, length)), 0).astype(np.float32),
      row_mask=np.ones(rows, bool))


def abstract(tree, shardings):
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      tree, shardings)


def compile_case(cfg, mesh_shape, devices, rows, length, microbatches) -> dict:
  """The policy step for this model, mesh and batch, compiled (not run), with its memory."""
  opts = sharding.ShardingOptions(mesh=tuple(zip(("data", "fsdp", "tensor"), mesh_shape)))
  n = int(np.prod(mesh_shape))
  mesh = sharding.make_mesh(opts, devices=devices[:n])
  graphdef, abstract_params = train_steps.split_model(decoder.abstract(cfg, rules=opts.rules))
  tx = train_steps.make_optimizer(train_steps.OptimizerOptions(learning_rate=1e-5))
  place = train_steps.placement(abstract_params, tx, mesh, opts.rules)
  step = train_steps.policy_step(graphdef, tx, place, loss.LossOptions(),
                              train_steps.StepOptions(num_microbatches=microbatches,
                                                   logprob_chunk_size=_CHUNK.value))
  batch = policy_batch(rows, length, cfg.vocab_size)
  abstract_opt = abstract(jax.eval_shape(tx.init, abstract_params), place.opt_state)
  t = time.perf_counter()
  with jax.set_mesh(mesh):
    compiled = step.jitted.lower(abstract(abstract_params, place.params), abstract_opt,
                                 abstract(batch, jax.tree.map(lambda _: place.batch, batch))
                                 ).compile()
  return {"mesh": list(mesh_shape), "devices": n, "rows": rows, "microbatches": microbatches,
          "compile_s": time.perf_counter() - t,
          "memory": benchmark.compiled_memory(compiled, num_devices=n),
          "_run": (compiled, opts, tx, place, batch)}


def time_case(cfg, case: dict, length: int, peak_flops_per_chip) -> dict:
  """Runs a compiled case `--repeats` times after one warm-up; adds rates and MFU."""
  compiled, opts, tx, place, batch = case.pop("_run")
  rows, n = case["rows"], case["devices"]
  step_flops = flops.train_step_flops(cfg, rows, length)
  case["model_flops_per_step"] = step_flops
  params = jax.jit(lambda: train_steps.split_model(decoder.init(cfg, 0, rules=opts.rules))[1],
                   out_shardings=place.params)()
  opt_state = jax.jit(tx.init, out_shardings=place.opt_state)(params)
  batch = jax.device_put(batch, place.batch)
  times = []
  for i in range(_REPEATS.value + 1):
    t = time.perf_counter()
    params, opt_state, metrics = compiled(params, opt_state, batch)
    jax.block_until_ready((params, metrics))
    if i:
      times.append(time.perf_counter() - t)
  median = statistics.median(times)
  case.update(timed=True, step_s=median, times_s=times, tokens_per_step=rows * length,
              tokens_per_s=rows * length / median,
              model_tflops_per_s=step_flops / median / 1e12,
              loss=float(metrics["loss"]), grad_norm=float(metrics["grad_norm"]))
  if peak_flops_per_chip:
    case["mfu"] = flops.mfu(step_flops, median, peak_flops_per_chip * n)
  del params, opt_state
  return case


def run_case(cfg, mesh_shape, devices, rows, length, microbatches, peak_flops_per_chip
             ) -> dict:
  case = compile_case(cfg, mesh_shape, devices, rows, length, microbatches)
  if (jax.default_backend() == "cpu"
      and case["memory"]["peak_bytes_all_devices"] > _BUDGET.value * 2**30):
    case.pop("_run")
    case["model_flops_per_step"] = flops.train_step_flops(cfg, rows, length)
    case["timed"] = False
    case["not_timed_because"] = (
        f"the {case['devices']} simulated devices together need "
        f"{case['memory']['peak_bytes_all_devices'] / 2**30:.1f} GiB (> "
        f"{_BUDGET.value} GiB budget on a shared machine)")
    return case
  return time_case(cfg, case, length, peak_flops_per_chip)


def fit_microbatch(cfg, mesh_shape, devices, length, budget_bytes, peak_flops_per_chip) -> dict:
  """The largest micro-batch (rows, one micro-batch per step) whose compiled peak memory per
  device fits `budget_bytes`, timed. Peak memory is close to affine in the rows, so two
  compiles (1 and 2 rows) predict the largest fit; it is compiled and, if it does not fit,
  shrunk by 15 % until it does (three or four compiles in all)."""
  trace, fits = [], {}

  def attempt(rows):
    case = compile_case(cfg, mesh_shape, devices, rows, length, 1)
    peak = case["memory"]["peak_bytes_per_device"]
    trace.append({"rows": rows, "peak_bytes_per_device": peak, "compile_s": case["compile_s"]})
    if peak <= budget_bytes:
      fits[rows] = case
    return peak

  one = attempt(1)
  if one > budget_bytes:
    return {"mesh": list(mesh_shape), "timed": False, "search": trace,
            "not_timed_because": f"one row needs {one / 2**30:.1f} GiB > budget "
                                 f"{budget_bytes / 2**30:.1f} GiB"}
  per_row = max(attempt(2) - one, 1)
  guess = int((budget_bytes - one) // per_row) + 1
  while guess > 2 and guess not in fits:
    attempt(guess)
    guess = guess if guess in fits else int(guess * 0.85)
  best = max(fits)
  for rows in list(fits):
    if rows != best:
      fits.pop(rows).pop("_run")  # free the smaller executables before timing
  case = time_case(cfg, fits[best], length, peak_flops_per_chip)
  case.update(search=trace, budget_bytes_per_device=budget_bytes)
  return case


def fit_budget_bytes(device) -> float:
  if _FIT_GIB.value is not None:
    return _FIT_GIB.value * 2**30
  stats = device.memory_stats() if device.platform != "cpu" else None
  if stats and stats.get("bytes_limit"):
    return 0.92 * stats["bytes_limit"]
  return 2.0 * 2**30


def main(_):
  gpu = _GPU.value
  devices = jax.devices("gpu") if gpu else jax.devices("cpu")
  presets = _PRESETS.value or (["qwen3_1p7b"] if gpu else ["tiny", "qwen3_97m"])
  meshes = _MESHES.value or ([f"1x{len(devices)}x1"] if gpu else
                             ["1x1x1", "8x1x1", "2x2x2", "2x4x1"])
  rows = _ROWS.value or (32 if gpu else 16)
  length = _LENGTH.value or (2048 if gpu else 128)
  microbatches = _MICRO.value or (8 if gpu else 2)
  kind = devices[0].device_kind
  peak = _PEAK.value
  if peak is None and gpu:
    peak = next((v for k, v in PEAK_TFLOPS.items() if k in kind), None)
  peak_flops = peak * 1e12 if peak else None
  load_before = benchmark.machine()["load_average_start"]
  fit_budget = fit_budget_bytes(devices[0]) if _FIT.value else None
  results = []
  for name in presets:
    cfg = model_config(name)
    for text in meshes:
      shape = tuple(int(s) for s in text.split("x"))
      measured = (fit_microbatch(cfg, shape, devices, length, fit_budget, peak_flops)
                  if _FIT.value else
                  run_case(cfg, shape, devices, rows, length, microbatches, peak_flops))
      case = {"preset": name, "params": decoder.num_params(decoder.abstract(cfg)),
              "matmul_params": flops.matmul_params(cfg), **measured}
      if not case.get("timed"):
        results.append(case)
        write_report(presets, rows, length, microbatches, peak, results, kind, devices, gpu,
                     load_before)
        print(f"{name} mesh {text}: not timed: {case['not_timed_because']}", flush=True)
        continue
      results.append(case)
      write_report(presets, rows, length, microbatches, peak, results, kind, devices, gpu,
                   load_before)
      rate = f"{case['tokens_per_s']:.0f} tokens/s ({case['step_s']:.2f} s/step)"
      print(f"{name} mesh {text}, {case['rows']} rows: {rate}; peak memory "
            f"{case['memory']['peak_bytes_per_device'] / 2**20:.0f} MiB/device; compile "
            f"{case['compile_s']:.1f} s" + (f"; MFU {case['mfu']:.3f}" if "mfu" in case else ""),
            flush=True)
  write_report(presets, rows, length, microbatches, peak, results, kind, devices, gpu,
               load_before)


def write_report(presets, rows, length, microbatches, peak, results, kind, devices, gpu,
                 load_before) -> None:
  """Writes what has been measured so far (after every case: a run stopped by a time limit
  keeps its finished cases)."""
  report = {
      "benchmark": "bench_train_step",
      "step": {"rows": "fitted per case" if _FIT.value else rows, "length": length,
               "microbatches": 1 if _FIT.value else microbatches,
               "logprob_chunk_size": _CHUNK.value, "repeats": _REPEATS.value,
               "loss": "policy loss, spec defaults (token ratio, clip 0.2, seq_mean_token_mean)",
               "optimizer": "clip 1.0 + AdamW, float32 state"},
      "model_configs": {name: dataclasses.asdict(model_config(name)) for name in presets},
      "flops_convention": "6·N + 12·layers·heads·head_dim·length per token (PaLM App. B); "
                          "N excludes an untied input embedding",
      "peak_tflops_per_chip": peak,
      "results": results,
      "machine": dict(benchmark.machine(), device_kind=kind, devices=len(devices),
                      simulated_cpu_devices=not gpu, load_average_start=load_before),
  }
  benchmark.write_result(_JSON.value, report)


if __name__ == "__main__":
  cli.run(main)
