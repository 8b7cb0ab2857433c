"""What every benchmark result file records: the machine it ran on, and the file itself; the
memory of a compiled program, as XLA's analysis gives it; two samplers' throughput side by side
from their result files.

    info = benchmark.machine()                 # at the start: load average before the run
    ...
    benchmark.write_result(path, {"records": ..., "machine": info})

The machine's load average is recorded before and after the run because these machines are
shared: a ratio measured in one run is robust to other load, an absolute time is not.
"""

from __future__ import annotations

import json
import os
import platform
from typing import Optional

import psutil


def cpu_model() -> str:
  """The CPU's model name (from /proc/cpuinfo where there is one: psutil does not report it)."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown"


# Instruction sets that change the code XLA's CPU backend emits (and so its float rounding).
_ISA = ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile")


def cpu_id(cpuinfo: Optional[str] = None) -> dict:
  """The CPU beyond its model name, from /proc/cpuinfo's first processor (`cpuinfo`: that
  file's text): vendor, family, model and stepping numbers, and which of `_ISA` it has. A
  model name such as "AMD EPYC" covers several generations, and the same seed's SFT reaches
  different accuracies on them; {} where there is no /proc/cpuinfo."""
  if cpuinfo is None:
    try:
      with open("/proc/cpuinfo") as f:
        cpuinfo = f.read()
    except OSError:
      return {}
  fields: dict[str, str] = {}
  for line in cpuinfo.splitlines():
    if not line.strip():
      if fields:
        break  # the first processor only
      continue
    key, _, value = line.partition(":")
    fields.setdefault(key.strip(), value.strip())
  flags = set(fields.get("flags", "").split())
  out = {name: fields[key] for name, key in (("vendor", "vendor_id"), ("family", "cpu family"),
                                             ("model", "model"), ("stepping", "stepping"))
         if key in fields}
  out["isa"] = [f for f in _ISA if f in flags]
  return out


def host_memory_gib() -> float:
  return round(psutil.virtual_memory().total / 2**30, 1)


def machine(jax_info: bool = True) -> dict:
  """The machine, its software and its current load (`load_average_start`)."""
  info = {"cpu": cpu_model(), "cpu_id": cpu_id(), "cpus": os.cpu_count(),
          "cpus_usable": len(os.sched_getaffinity(0)), "host_memory_gib": host_memory_gib(),
          "platform": platform.platform(), "python": platform.python_version()}
  if jax_info:
    import jax  # pylint: disable=import-outside-toplevel  (the vLLM benchmark runs without it)
    info.update(jax=jax.__version__, backend=jax.default_backend(),
                devices=[str(d) for d in jax.devices()])
  # Other processes on the machine (1/5/15-minute load averages).
  info["load_average_start"] = list(os.getloadavg())
  return info


def compiled_memory(compiled, num_devices: int = 1) -> dict:
  """Bytes of a compiled program (`jax.jit(f).lower(...).compile()`) on each device, from XLA's
  memory analysis (CPU has no allocator statistics; the program need not run):
  `argument_bytes`, `output_bytes`, `temp_bytes`, `alias_bytes` (outputs that reuse donated
  arguments), `generated_code_bytes`, and

  * `peak_bytes`: temporaries + outputs − aliased, what running the program adds to its
    arguments at its peak (programs that take the same arguments compare on it);
  * `peak_bytes_per_device`: arguments + `peak_bytes`, all the program holds at its peak;
  * `peak_bytes_all_devices`: that on each of `num_devices` devices.
  """
  if num_devices < 1:
    raise ValueError(f"num_devices: must be >= 1, got {num_devices}")
  m = compiled.memory_analysis()
  out = {"argument_bytes": m.argument_size_in_bytes, "output_bytes": m.output_size_in_bytes,
         "temp_bytes": m.temp_size_in_bytes, "alias_bytes": m.alias_size_in_bytes,
         "generated_code_bytes": m.generated_code_size_in_bytes}
  out["peak_bytes"] = out["temp_bytes"] + out["output_bytes"] - out["alias_bytes"]
  out["peak_bytes_per_device"] = out["argument_bytes"] + out["peak_bytes"]
  out["peak_bytes_all_devices"] = out["peak_bytes_per_device"] * num_devices
  return out


def sampler_comparison(ours: dict, vllm: dict, source: str) -> dict:
  """The JAX sampler's tokens per second (`ours`, `benchmarks.bench_sampler`'s `jax` section)
  beside vLLM's (`vllm`, `benchmarks.bench_vllm`'s result, read from `source`) at the batch
  sizes both measured: vLLM over JAX per batch, with both setups, models and machines (a ratio
  is like for like only where `same_setup`: the same prompt and new tokens per row)."""
  if "throughput" not in vllm or "throughput_setup" not in vllm:
    raise ValueError(f"{source}: not an benchmarks.bench_vllm result (no 'throughput' or "
                     "'throughput_setup')")
  theirs = {r["batch"]: r["tokens_per_s"] for r in vllm["throughput"]}
  batches = [r for r in ours["throughput"] if r["batch"] in theirs]
  setup = ("prompt_len", "new_tokens")
  return {"source": source,
          "same_setup": all(ours["setup"][k] == vllm["throughput_setup"][k] for k in setup),
          "setup": {"jax": {k: ours["setup"][k] for k in setup},
                    "vllm": {k: vllm["throughput_setup"][k] for k in setup}},
          "models": {"jax": ours["model"], "vllm": vllm.get("model", {}).get("spec")},
          "machines": {name: {k: run.get("machine", {}).get(k)
                              for k in ("cpu", "cpus", "platform")}
                       for name, run in (("jax", ours), ("vllm", vllm))},
          "throughput": [{"batch": r["batch"], "jax_tokens_per_s": r["tokens_per_s"],
                          "vllm_tokens_per_s": theirs[r["batch"]],
                          "vllm_over_jax": theirs[r["batch"]] / r["tokens_per_s"]}
                         for r in batches]}


def write_result(path: Optional[str], result: dict, indent: int = 2) -> str:
  """Writes `result` as JSON to `path` (if given), stamping the machine's load at the end;
  returns the text."""
  if isinstance(result.get("machine"), dict):
    result["machine"]["load_average_end"] = list(os.getloadavg())
  text = json.dumps(result, indent=indent)
  if path:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
      f.write(text + "\n")
  return text


NOTES_MARKER = "<!-- notes: written by hand, kept when the bench rewrites this file -->"


def write_markdown(path: str, markdown: str) -> None:
  """Writes a benchmark's generated Markdown to `path`, keeping any hand-written part of the
  file that follows `NOTES_MARKER` (an explanation of the results stays with them across
  reruns)."""
  notes = ""
  if os.path.exists(path):
    with open(path) as f:
      old = f.read()
    if NOTES_MARKER in old:
      notes = "\n" + old[old.index(NOTES_MARKER):]
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    f.write(markdown.rstrip("\n") + "\n" + notes)
