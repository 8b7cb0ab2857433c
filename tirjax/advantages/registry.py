"""The estimator registry: the only list of valid advantage names (spec §4).

An estimator is a pure, jit-able function `(Rollouts, options) -> Advantages`, with its
options a frozen dataclass whose defaults are the spec's. Options are static under `jit`.
`needs` names the optional `Rollouts` fields it always reads (e.g. remax's `greedy_outcome`),
so that a trainer can check before any compute that its rollout stage records them. `spec`,
optional, is documentation: the section of docs/spec.md that defines the estimator (4.1 PORTool,
4.2 HiDiffTIR, 4.3 the papers' baselines, 4.4 the estimators beyond them). An estimator without
one registers all the same; one given must be a section of the spec (`tirjax.spec_sections`).
The ablation grids list estimators by it (`names(spec=...)`): 4.1-4.3 are the seeds' cells,
every other estimator, sectioned or not, is "beyond" (`configs/ablate.py`), but for the
controls there (`CONTROLS`: the oracle, an upper bound, not a method), which join only the
grids that name them.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping

import jax

from tirjax import spec_sections
from tirjax.rollouts import Advantages, Rollouts  # noqa: F401  (Advantages: re-exported)


@dataclasses.dataclass(frozen=True)
class Estimator:
  name: str
  fn: Callable[[Rollouts, Any], Advantages]
  options: type
  spec: str | None = None  # the docs/spec.md section that defines it (documentation only)
  needs: tuple[str, ...] = ()

  def make_options(self, overrides: Mapping[str, Any] | None = None):
    """Options from a mapping (e.g. a config section); unknown keys fail by name."""
    overrides = dict(overrides or {})
    known = {f.name for f in dataclasses.fields(self.options)}
    unknown = sorted(set(overrides) - known)
    if unknown:
      raise ValueError(f"advantage '{self.name}': unknown option(s) {unknown}; "
                       f"valid options are {sorted(known)}")
    return self.options(**overrides)

  def __call__(self, rollouts: Rollouts, options=None) -> Advantages:
    return _jitted(self.fn)(rollouts, options if options is not None else self.options())


@functools.cache
def _jitted(fn):
  return jax.jit(fn, static_argnums=1)


_REGISTRY: dict[str, Estimator] = {}


def register(name: str, options: type, *, spec: str | None = None,
             needs: tuple[str, ...] = ()):
  """Decorator: `@register("grpo", GRPOOptions, spec="4.3")` on `fn(rollouts, options) ->
  Advantages`; `spec` (optional): the docs/spec.md section that defines it, which must exist;
  `needs`: the optional `Rollouts` fields that `fn` always reads."""
  def wrap(fn):
    if name in _REGISTRY:
      raise ValueError(f"advantage estimator '{name}' is registered twice")
    spec_sections.check(spec, f"advantage estimator '{name}'")
    if not (dataclasses.is_dataclass(options) and options.__dataclass_params__.frozen):
      raise TypeError(f"options of '{name}' must be a frozen dataclass (hashable, static)")
    _REGISTRY[name] = Estimator(name, fn, options, spec, tuple(needs))
    return fn
  return wrap


def get(name: str) -> Estimator:
  if name not in _REGISTRY:
    raise KeyError(f"unknown advantage estimator '{name}'; registered: {names()}")
  return _REGISTRY[name]


def names(spec: str | tuple[str, ...] | None = None) -> list[str]:
  """The registered names, sorted; with `spec`, those whose section is `spec` (or one of
  them); estimators registered without a section have none."""
  sections = (spec,) if isinstance(spec, str) else spec
  return sorted(n for n, e in _REGISTRY.items() if sections is None or e.spec in sections)
