"""The environment of a test's multi-process JAX runs (several processes with one coordinator)."""

from __future__ import annotations

import os

_DEVICE_COUNT = "--xla_force_host_platform_device_count="


def multiprocess_env(devices_per_process: int) -> dict[str, str]:
  """`os.environ` with the repository on PYTHONPATH, `devices_per_process` simulated CPU
  devices, and without the suite's persistent compilation cache (tests/conftest.py): with it,
  2-process runs deadlocked in their first collective on jax 0.12.1 (tests/test_packed_processes.py
  in each of 3 runs under pytest, in none of 5 without it; tests/test_multiprocess.py in CI;
  the cause not found). XLA_FLAGS keeps its other flags (under pytest, conftest's LLVM
  optimisation level 0, which roughly halves these runs' compile time); only the device count
  is replaced."""
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE"))}
  kept = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(_DEVICE_COUNT)]
  env.update(PYTHONPATH=os.getcwd(),
             XLA_FLAGS=" ".join(kept + [f"{_DEVICE_COUNT}{devices_per_process}"]))
  return env
