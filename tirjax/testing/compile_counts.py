"""Counting XLA compilations and jaxpr traces inside a block, through JAX's public monitoring
events: a test asserts that a step or a sampler compiles (or traces) once."""

from __future__ import annotations

import contextlib

import jax


def count_compiles():
  """Yields a list that collects the duration of every XLA compilation in the block."""
  return _count_events("/jax/core/compile/backend_compile_duration")


def compiled_functions():
  """Yields a list that collects the name of the function of every XLA compilation in the
  block (`jit(<name>)`): a test counts one function's executables among everything else
  that compiles (helpers, placement)."""
  return _count_events("/jax/core/compile/backend_compile_duration", names=True)


def count_traces():
  """Yields a list that collects every trace of a jitted function to a jaxpr in the block: a
  retrace shows here even where the persistent compilation cache spares the compile.

  Not `chex.assert_max_traces`: that wraps a function before it is jitted, and the functions
  counted here are jitted inside the library (`TrainStep`, the sampler, the reference pass);
  JAX's public monitoring events count their traces without a test hook in library code."""
  return _count_events("/jax/core/compile/jaxpr_trace_duration")


@contextlib.contextmanager
def _count_events(name: str, names: bool = False):
  events = []

  def listener(event, duration, **kwargs):
    if event == name:
      events.append(kwargs.get("fun_name") if names else duration)

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    yield events
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
