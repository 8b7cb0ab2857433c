"""tirjax/testing/mappings.py: the guard that keeps a long-lived pytest worker under the
kernel's cap on memory mappings (past it, XLA's next compilation dies of a segfault)."""

import jax
import jax.numpy as jnp
import pytest

from tirjax.testing import mappings


@jax.jit
def _kernel(x):
  return jnp.cumsum(jnp.sin(x)) ** 2


def _compile_shapes(n: int, offset: int):
  for i in range(n):
    _kernel(jnp.ones((offset + i,))).block_until_ready()


def test_compiled_programs_hold_mappings_until_released():
  _compile_shapes(1, 1)  # the runtime's own first mappings
  before = mappings.mapping_count()
  _compile_shapes(40, 1000)
  held = mappings.mapping_count()
  assert held - before >= 40 * 5, (before, held)  # several per program, kept by jit's cache
  limit = mappings.mapping_limit()
  assert not mappings.release_when_near_limit(min(0.99, (held + 100) / limit))
  assert mappings.mapping_count() >= held - 10
  assert mappings.release_when_near_limit((held - 100) / limit)
  assert mappings.mapping_count() < held - 40 * 5
  # what was released compiles again on its next call
  assert float(_kernel(jnp.zeros((3,)))[-1]) == 0.0


def test_the_limit_is_the_kernels():
  with open("/proc/sys/vm/max_map_count") as f:
    assert mappings.mapping_limit() == int(f.read())


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.5, 2.0])
def test_a_fraction_outside_the_unit_interval_is_refused(fraction):
  with pytest.raises(ValueError, match="fraction"):
    mappings.release_when_near_limit(fraction)
