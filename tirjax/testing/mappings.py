"""A process's memory-mapping budget, and releasing jax's compiled programs before it runs out.

Each program XLA's CPU backend compiles keeps about 18 memory mappings (LLVM's JIT code and
data sections) for as long as jit's caches hold it. Linux caps the mappings of one process at
`vm.max_map_count` (65,530 by default). At the cap LLVM's next allocation fails ("LLVM
compilation error: Cannot allocate memory") and the process dies of a segmentation fault, not
an exception: measured on this repository's CPU machine (AMD EPYC Zen 5, 2 cores), 2,750
distinct programs held in one process reach 64,301 mappings and the next compilation crashes.

A long-lived pytest worker gets there: the property tests call module-level jitted kernels at
hundreds of shapes, and jit keeps every one. Two clean-clone runs of the suite lost a worker
that way (once inside the compilation cache's write, once in a trainer smoke run).
`release_when_near_limit` drops jit's caches once a process holds half its budget; programs
still in use compile again on their next call.
"""

import gc

import jax

_DEFAULT_LIMIT = 65530


def mapping_count() -> int:
  """The number of memory mappings this process holds (lines of /proc/self/maps)."""
  with open("/proc/self/maps", "rb") as f:
    return sum(1 for _ in f)


def mapping_limit() -> int:
  """The kernel's cap on one process's mappings (`vm.max_map_count`)."""
  try:
    with open("/proc/sys/vm/max_map_count") as f:
      return int(f.read())
  except (OSError, ValueError):
    return _DEFAULT_LIMIT


def release_when_near_limit(fraction: float = 0.5) -> bool:
  """Clears jax's caches of compiled programs when this process holds more than `fraction`
  of its mapping budget; returns whether it did."""
  if not 0 < fraction < 1:
    raise ValueError(f"fraction must lie in (0, 1), got {fraction}")
  if mapping_count() <= fraction * mapping_limit():
    return False
  jax.clear_caches()
  gc.collect()
  return True
