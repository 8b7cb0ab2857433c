"""The environment of a test's multi-process JAX runs (several processes with one coordinator)."""

from __future__ import annotations

import os


def multiprocess_env(devices_per_process: int, xla_flags: str = "") -> dict[str, str]:
  """`os.environ` with the repository on PYTHONPATH, `devices_per_process` simulated CPU
  devices, and without the suite's persistent compilation cache (tests/conftest.py): with it,
  2-process runs deadlocked in their first collective on jax 0.12.1 (tests/test_packed_processes.py
  in each of 3 runs under pytest, in none of 5 without it; tests/test_multiprocess.py in CI;
  the cause not found). `xla_flags`: more XLA flags (e.g. conftest's
  `--xla_backend_optimization_level=0`, which roughly halves test_packed_processes.py's compile
  time; not given by test_multiprocess.py, whose 1- and 2-process RL gradient norms then
  differed by 5e-3 relative, over its 1e-4 tolerance)."""
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE"))}
  env.update(PYTHONPATH=os.getcwd(), XLA_FLAGS=" ".join(
      [f"--xla_force_host_platform_device_count={devices_per_process}"] + xla_flags.split()))
  return env
