"""Test-session set-up: 8 simulated CPU devices (set before jax is imported) and hypothesis."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import hypothesis  # noqa: E402

hypothesis.settings.register_profile(
    "tirjax", deadline=None, max_examples=60, derandomize=True,
    suppress_health_check=[hypothesis.HealthCheck.too_slow, hypothesis.HealthCheck.data_too_large])
hypothesis.settings.load_profile("tirjax")
