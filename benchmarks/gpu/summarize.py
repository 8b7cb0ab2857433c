"""Merges the sections of `benchmarks/gpu/run.sh` into DIR/gpu.json and prints a short table.

    python benchmarks/gpu/summarize.py [--dry_run] DIR [NAME=ok:SECONDS | NAME=failed(RC):SECONDS ...]

Checks the issue-19 targets where the numbers exist: MFU >= 0.40 for the 1.7B size; chunked
log-probs at <= 0.25x the naive peak memory and <= 1.25x its time; every kernel faster than its
CPU loop reference; and issue 38's: the shared/packed update + reference pass >= 4x the
padded one on long shared prompts. A section that is missing or failed is reported as such,
never as a pass.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

from absl import app, flags

flags.DEFINE_bool("dry_run", False, "The sections ran at tiny sizes on the CPU.")
FLAGS = flags.FLAGS

SECTIONS = ("train_step", "logprobs", "kernels", "sampler", "update")


def _load(directory: str, name: str):
  path = os.path.join(directory, f"{name}.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _commit() -> str:
  try:
    return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def targets(data: dict) -> list[dict]:
  """Each target with its measured value and whether it holds (None: not measured)."""
  out = []
  train = data.get("train_step") or {}
  big = [r for r in train.get("results", []) if r.get("preset") == "qwen3_1p7b"]
  mfu = big[0].get("mfu") if big else None
  out.append({"target": "MFU >= 0.40, qwen3_1p7b train step", "value": mfu,
              "holds": None if mfu is None else mfu >= 0.40})
  logprobs = (data.get("logprobs") or {}).get("results", {})
  for name in ("logprobs", "logprobs_grad"):
    r = logprobs.get(name)
    mem = r["memory"]["ratio"] if r else None
    tim = r["time"]["ratio"] if r else None
    out.append({"target": f"{name}: chunked memory <= 0.25x naive", "value": mem,
                "holds": None if mem is None else mem <= 0.25})
    out.append({"target": f"{name}: chunked time <= 1.25x naive", "value": tim,
                "holds": None if tim is None else tim <= 1.25})
  records = (data.get("kernels") or {}).get("records", [])
  slow = [r["name"] for r in records if r["speedup"] <= 1.0]
  out.append({"target": "every kernel faster than its CPU reference",
              "value": f"{len(records) - len(slow)}/{len(records)} faster" if records else None,
              "holds": None if not records else not slow})
  update = ((data.get("update") or {}).get("cases") or {}).get("synthetic")
  speedup = update["speedup_total"] if update else None
  out.append({"target": "shared/packed update + reference >= 4x padded (shared 4096-token "
                        "prompts, short responses)", "value": speedup,
              "holds": None if speedup is None else speedup >= 4.0})
  return out


def table(data: dict, status: dict) -> str:
  lines = ["section     status          seconds", "-------     ------          -------"]
  for name in SECTIONS:
    state, seconds = status.get(name, ("not run", "-"))
    lines.append(f"{name:11s} {state:15s} {seconds}")
  lines.append("")
  for r in (data.get("train_step") or {}).get("results", []):
    if r.get("timed"):
      lines.append(f"train {r['preset']:11s} {r['rows']:4d} rows x {r['tokens_per_step'] // r['rows']}"
                   f" tokens: {r['tokens_per_s']:10.0f} tokens/s, MFU {r.get('mfu', float('nan')):.3f},"
                   f" peak {r['memory']['peak_bytes_per_device'] / 2**30:.1f} GiB")
  for name, r in ((data.get("logprobs") or {}).get("results") or {}).items():
    lines.append(f"{name:14s} chunked/naive: memory {r['memory']['ratio']:.3f}, "
                 f"time {r['time']['ratio']:.3f}")
  for r in (data.get("kernels") or {}).get("records", []):
    lines.append(f"kernel {r['name']:22s} {r['jax_ms']:9.2f} ms vs loops {r['reference_ms']:9.1f}"
                 f" ms: {r['speedup']:7.1f}x")
  for r in ((data.get("sampler") or {}).get("sections", {}).get("jax", {})
            .get("throughput", [])):
    lines.append(f"jax sampler batch {r['batch']:4d}: {r['tokens_per_s']:10.0f} tokens/s")
  for name, r in ((data.get("update") or {}).get("cases") or {}).items():
    lines.append(f"update {name}: padded {r['padded']['total_s']:.2f} s, packed "
                 f"{r['packed']['total_s']:.2f} s ({r['speedup_total']:.1f}x)")
  lines.append("")
  for t in targets(data):
    verdict = {True: "holds", False: "FAILS", None: "not measured"}[t["holds"]]
    lines.append(f"target {t['target']}: {verdict} ({t['value']})")
  return "\n".join(lines)


def main(argv: list[str]) -> int:
  """argv: the program name, DIR, then one NAME=STATE:SECONDS per section that ran."""
  if len(argv) < 2:
    raise app.UsageError("DIR is required")
  directory, rest = argv[1], argv[2:]
  dry_run = FLAGS.dry_run
  status = {}
  for item in rest:
    name, _, value = item.partition("=")
    state, _, seconds = value.rpartition(":")
    status[name] = (state, seconds)
  data = {name: _load(directory, name) for name in SECTIONS}
  result = {"benchmark": "gpu", "dry_run": dry_run, "commit": _commit(),
            "host": {"platform": platform.platform(), "python": platform.python_version(),
                     "cores": os.cpu_count()},
            "status": {k: {"state": s, "seconds": t} for k, (s, t) in status.items()},
            "targets": targets(data), "sections": data}
  with open(os.path.join(directory, "gpu.json"), "w") as f:
    json.dump(result, f, indent=1)
  print(table(data, status))
  failed = [n for n in SECTIONS if status.get(n, ("not run",))[0] != "ok"]
  if failed:
    print(f"sections that did not finish: {failed}", file=sys.stderr)
  return 1 if failed else 0


if __name__ == "__main__":
  app.run(main)
