"""What a pytest run printed, read back: its closing counts and its slowest tests
(`--durations`), for `benchmarks.bench_test_suite`'s result files."""

from __future__ import annotations

import re


def parse(output: str) -> dict:
  """pytest's closing counts and its `slowest N durations` lines from `output`."""
  counts = {}
  tail = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed)", line)]
  if tail:
    for n, what in re.findall(r"(\d+) (passed|failed|skipped|errors?|warnings?|deselected)",
                              tail[-1]):
      counts[what] = int(n)
  slowest = [{"seconds": float(m[1]), "phase": m[2], "test": m[3]}
             for m in re.finditer(r"^([\d.]+)s (setup|call|teardown)\s+(\S+)$", output, re.M)]
  return {"counts": counts, "slowest": slowest}
