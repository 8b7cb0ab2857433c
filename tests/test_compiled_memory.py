"""`tirjax.reporting.benchmark.compiled_memory`: XLA's memory analysis as the bench scripts
record it (benchmarks.bench_model compares `peak_bytes`, benchmarks.bench_train_step
`peak_bytes_per_device` and `peak_bytes_all_devices`)."""

import jax
import jax.numpy as jnp
import pytest

from tirjax.reporting import benchmark

X = jnp.ones((256, 256), jnp.float32)  # 256 KiB
KIB = 1024


def test_fields_add_up_and_arguments_count_only_in_the_per_device_peak():
  compiled = jax.jit(lambda x: jnp.tanh(x @ x) + x).lower(X).compile()
  m = benchmark.compiled_memory(compiled, num_devices=3)
  assert m["argument_bytes"] == m["output_bytes"] == 256 * KIB
  assert m["alias_bytes"] == 0
  assert m["peak_bytes"] == m["temp_bytes"] + m["output_bytes"]
  assert m["peak_bytes_per_device"] == m["argument_bytes"] + m["peak_bytes"]
  assert m["peak_bytes_all_devices"] == 3 * m["peak_bytes_per_device"]
  assert {"generated_code_bytes"} < set(m)


def test_a_donated_argument_reused_as_output_is_not_counted_twice():
  f = lambda x: x * 2.0  # noqa: E731
  kept = benchmark.compiled_memory(jax.jit(f).lower(X).compile())
  donated = benchmark.compiled_memory(jax.jit(f, donate_argnums=0).lower(X).compile())
  assert donated["alias_bytes"] == 256 * KIB
  assert donated["peak_bytes_per_device"] == kept["peak_bytes_per_device"] - 256 * KIB


def test_num_devices_must_be_positive():
  compiled = jax.jit(lambda x: x + 1).lower(X).compile()
  with pytest.raises(ValueError, match="num_devices: must be >= 1, got 0"):
    benchmark.compiled_memory(compiled, num_devices=0)
