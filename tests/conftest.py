"""Test-session set-up: 8 simulated CPU devices and unoptimised CPU code generation (set
before jax is imported), hypothesis, and the session fixtures several test files share (the
toolworld tokenizer, the toolworld vLLM server)."""

import os

# LLVM optimisation level 0: tests compile many small programs and run them briefly, so
# compilation dominates; level 0 cuts their CPU time by a third to a half on 2 cores.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 "
                      "--xla_backend_optimization_level=0")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# A persistent compilation cache shared by the trainer subprocesses that tests start (each a
# fresh process compiling the same tiny model's sampler and steps): they compile each program
# once per checkout. The pytest processes themselves do not use it (below).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      os.path.join(os.path.dirname(os.path.dirname(__file__)), ".jax_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")

import contextlib  # noqa: E402
import fcntl  # noqa: E402
import tempfile  # noqa: E402

import hypothesis  # noqa: E402
import jax  # noqa: E402
import pytest  # noqa: E402
from absl import flags  # noqa: E402

from tirjax.testing import mappings  # noqa: E402

# Not in the pytest processes: their programs are compiled once per worker by jit's own cache
# anyway; the subprocesses keep the persistent cache through the environment above. (Two
# clean-clone runs lost a worker to a segmentation fault inside the cache's write; the cause was
# the mapping budget below, the write only where it ran out.)
jax.config.update("jax_enable_compilation_cache", False)

hypothesis.settings.register_profile(
    "tirjax", deadline=None, max_examples=60, derandomize=True,
    suppress_health_check=[hypothesis.HealthCheck.too_slow, hypothesis.HealthCheck.data_too_large])
# `make test-fast` (`--hypothesis-profile=fast`): fewer examples per property, same properties.
hypothesis.settings.register_profile("fast", parent=hypothesis.settings.get_profile("tirjax"),
                                     max_examples=12)
hypothesis.settings.load_profile("tirjax")


def pytest_addoption(parser):
  parser.addoption("--inject-fault", default=None,
                   help="tests/test_rl_learns.py: run with this pipeline fault (must then fail)")


# The entry points' absl flags keep their defaults unless a test sets them
# (`absl.testing.flagsaver.as_parsed`); nothing parses a command line here.
flags.FLAGS.mark_as_parsed()


def pytest_collection_modifyitems(config, items):
  """Marks what `make test-fast` leaves out: the vLLM tests (`vllm`: they need the vLLM
  environment and start servers) besides the `slow` ones. `make test` runs everything."""
  del config
  for item in items:
    if item.module.__name__.split(".")[-1].startswith("test_vllm_"):
      item.add_marker(pytest.mark.vllm)


# Tests that keep several processes busy at once (`cores(n)`, n > 1: a run of 2 trainer
# processes, a grid at --parallel=2) run alone: while one runs, the other xdist worker waits,
# so no more processes compute at once than this machine's 2 cores (issue 52: with two such
# tests side by side the load stood at 8-11 on 2 cores). A reader-writer lock on files shared
# by every pytest process of the machine: each test holds it shared, a `cores` test
# exclusively; a turnstile lets a waiting `cores` test in before later shared holders.
_LOCKS = os.path.join(tempfile.gettempdir(), "tirjax-tests-cores")


@contextlib.contextmanager
def _cores(exclusive: bool):
  with open(_LOCKS + ".turnstile", "a") as turn, open(_LOCKS + ".lock", "a") as lock:
    fcntl.flock(turn, fcntl.LOCK_EX)
    try:
      fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    finally:
      fcntl.flock(turn, fcntl.LOCK_UN)
    try:
      yield
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  """Each test's set-up (module fixtures included), call and teardown under `_cores`."""
  del nextitem
  marker = item.get_closest_marker("cores")
  with _cores(exclusive=marker is not None and marker.args[0] > 1):
    yield
  # A worker that keeps every program jit compiled runs out of memory mappings and dies of a
  # segmentation fault (tirjax/testing/mappings.py); past half its budget the caches go.
  mappings.release_when_near_limit()


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
  """The toolworld tokenizer (a BPE built here, seed 0), shared by the tests that render chats
  and episodes; a test module may define its own `tokenizer` instead."""
  import transformers  # pylint: disable=import-outside-toplevel
  from tirjax.env.toolworld import build_tokenizer  # pylint: disable=import-outside-toplevel
  path = build_tokenizer(tmp_path_factory.getbasetemp() / "toolworld_tokenizer")
  return transformers.AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="session")
def toolworld(tmp_path_factory):
  """The toolworld vLLM tests' one server (`tirjax.testing.vllm_toolworld.serve_toolworld`),
  shared by test_vllm_toolworld.py and test_vllm_train.py; no process of it outlives it."""
  # pylint: disable=import-outside-toplevel  (only the vLLM tests import these)
  from tirjax.testing import vllm_processes
  from tirjax.testing.vllm_toolworld import serve_toolworld
  with serve_toolworld(str(tmp_path_factory.mktemp("vllm_toolworld"))) as world:
    tag = world.sampler.server.tag
    yield world
  assert vllm_processes.tagged_pids(tag) == []
