"""The GPU machine's image, checked on this CPU (issue 28): `make test-fast` and
benchmarks/gpu/run.sh --dry-run under the image's versions, written to compat.json.

    make test-compat     # creates .venv-compat (requirements-compat.txt), fills .whl/, runs:
    .venv-compat/bin/python -m experiments.studies.compat --venv=.venv-compat \
        --json=benchmarks/results/compat.json

The dry run runs with the packages the image lacks (ABSENT) blocked in the environment
(`benchmarks/gpu/absent/sitecustomize.py`) and `.whl/` installed, as on the GPU. The JSON
holds the versions found against those recorded for the image, the tests' counts (and the
failed tests by name), each dry-run section's state, and the machine. Exits non-zero when a
version differs from the image's pin, a test fails, or a section does not run.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

from absl import flags

from tirjax import cli
from tirjax.reporting import benchmark

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ABSENT = ("ml_collections", "jsonschema", "tensorboardX", "vllm")
IMAGE_PYTHON = "3.12.3"  # recorded on the GPU machine; pyenv's 3.12 here
PACKAGES = ("jax", "jaxlib", "numpy", "transformers", "tokenizers", "safetensors", "flax",
            "optax", "orbax-checkpoint", "chex", "absl-py", "torch")

FLAGS = flags.FLAGS
flags.DEFINE_string("venv", ".venv-compat", "the environment (make's VENV) to test")
flags.DEFINE_string("requirements", "requirements-compat.txt", "the image's recorded pins")
flags.DEFINE_string("json", None, "where to write the result")


def recorded_pins(path: str) -> dict[str, str]:
  """`name==version` lines of a requirements file."""
  pins = {}
  with open(path) as f:
    for line in f:
      m = re.match(r"^\s*([A-Za-z0-9_.-]+)\s*==\s*([^\s#;]+)", line)
      if m:
        pins[m.group(1).lower()] = m.group(2)
  return pins


def versions() -> dict[str, str | None]:
  out = {"python": platform.python_version()}
  for name in PACKAGES:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = None
  return out


def junit_counts(path: str) -> dict:
  """Counts and failed test ids from pytest's JUnit XML."""
  root = ET.parse(path).getroot()
  suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
  total = {k: sum(int(s.get(k, 0)) for s in suites)
           for k in ("tests", "failures", "errors", "skipped")}
  failed = [f"{c.get('classname')}::{c.get('name')}" for s in suites for c in s.iter("testcase")
            if c.find("failure") is not None or c.find("error") is not None]
  passed = total["tests"] - total["failures"] - total["errors"] - total["skipped"]
  return {"passed": passed, "failed": total["failures"] + total["errors"],
          "skipped": total["skipped"], "failed_tests": failed}


def run_tests(venv: str) -> dict:
  """`make test-fast` in `venv`, its counts from pytest's JUnit report."""
  with tempfile.TemporaryDirectory() as tmp:
    report = os.path.join(tmp, "junit.xml")
    start = time.monotonic()
    proc = subprocess.run(["make", "-s", "test-fast", f"VENV={venv}",
                           "REQUIREMENTS=requirements-compat.txt",
                           f"PYTEST_ARGS=--junitxml={report}"], cwd=ROOT, check=False)
    seconds = round(time.monotonic() - start, 1)
    counts = junit_counts(report) if os.path.exists(report) else {"passed": 0, "failed": None}
  return {"command": "make test-fast", "returncode": proc.returncode, "seconds": seconds,
          **counts}


def absent_env() -> dict:
  return {**os.environ, "TIRJAX_ABSENT": ",".join(ABSENT), "PYTHON": sys.executable,
          "PYTHONPATH": os.path.join(ROOT, "benchmarks", "gpu", "absent")}


def check_absent() -> dict[str, bool]:
  """Whether each of ABSENT fails to import in the dry run's environment (it must)."""
  blocked = {}
  for name in ABSENT:
    proc = subprocess.run([sys.executable, "-c", f"import {name}"], env=absent_env(),
                          cwd=ROOT, capture_output=True, text=True, check=False)
    blocked[name] = proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr
  return blocked


def run_dry_run() -> dict:
  """benchmarks/gpu/run.sh --dry-run --wheels with ABSENT blocked; each section's state."""
  with tempfile.TemporaryDirectory() as out:
    start = time.monotonic()
    proc = subprocess.run(["bash", "benchmarks/gpu/run.sh", "--dry-run", "--wheels",
                           f"--out={out}"], cwd=ROOT, env=absent_env(), capture_output=True,
                          text=True, check=False)
    seconds = round(time.monotonic() - start, 1)
    try:
      with open(os.path.join(out, "gpu.json")) as f:
        status = json.load(f)["status"]
    except (OSError, ValueError, KeyError):
      status = {}
    logs = {}
    for name, s in status.items():
      if s.get("state") != "ok":
        with open(os.path.join(out, f"{name}.log")) as f:
          logs[name] = f.read()[-2000:]
  return {"command": "benchmarks/gpu/run.sh --dry-run --wheels", "returncode": proc.returncode,
          "seconds": seconds, "sections": status, "failed_logs": logs,
          "stderr_tail": proc.stderr[-2000:] if proc.returncode else ""}


def main(argv):
  del argv
  info = benchmark.machine()
  pins = recorded_pins(os.path.join(ROOT, FLAGS.requirements))
  found = versions()
  differ = {k: {"image": v, "here": found.get(k)} for k, v in pins.items() if found.get(k) != v}
  if found["python"].rsplit(".", 1)[0] != IMAGE_PYTHON.rsplit(".", 1)[0]:
    differ["python"] = {"image": IMAGE_PYTHON, "here": found["python"]}
  tests = run_tests(FLAGS.venv)
  blocked = check_absent()
  dry = run_dry_run()
  dry_ok = dry["returncode"] == 0 and bool(dry["sections"]) and all(
      s.get("state") == "ok" for s in dry["sections"].values())
  result = {
      "command": "make test-compat",
      "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                               text=True, check=False).stdout.strip(),
      "image": {"python": IMAGE_PYTHON, **pins, "absent": list(ABSENT)},
      "versions": found, "differ_from_image": differ,
      "test_fast": tests, "absent_blocked": blocked,
      "gpu_dry_run": {**dry, "ok": dry_ok}, "machine": info,
  }
  ok = not differ and tests["failed"] == 0 and tests["returncode"] == 0 and all(
      blocked.values()) and dry_ok
  result["ok"] = ok
  print(benchmark.write_result(FLAGS.json, result))
  return 0 if ok else 1


if __name__ == "__main__":
  cli.run(main)
