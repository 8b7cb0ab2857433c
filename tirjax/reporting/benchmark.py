"""What every benchmark result file records: the machine it ran on, and the file itself.

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


def host_memory_gib() -> float:
  return round(psutil.virtual_memory().total / 2**30, 1)


def machine(jax_info: bool = True) -> dict:
  """The machine, its software and its current load (`load_average_start`)."""
  info = {"cpu": cpu_model(), "cpus": os.cpu_count(), "cpus_usable": len(os.sched_getaffinity(0)),
          "host_memory_gib": host_memory_gib(), "platform": platform.platform(),
          "python": platform.python_version()}
  if jax_info:
    import jax  # pylint: disable=import-outside-toplevel  (the vLLM benchmark runs without it)
    info.update(jax=jax.__version__, backend=jax.default_backend(),
                devices=[str(d) for d in jax.devices()])
  # Other processes on the machine (1/5/15-minute load averages).
  info["load_average_start"] = list(os.getloadavg())
  return info


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
