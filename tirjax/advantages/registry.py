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

A registration is everything the rest of the project knows about an estimator (issue 57), its
protocol, read where it is needed and written nowhere else:

  reference        "module:function", the plain-loop reference the kernel is tested and timed
                   against (`tirjax.testing.reference.REFERENCES` reads it; required)
  protocol         whose comparison protocol it trains on: "portool" (groups of 8, T_max = 6,
                   no KL) or "hidifftir" (groups of 16, KL 0.001, `<answer>` tags), as
                   `configs/base.py`'s `<protocol>_protocol()` gives it
  rollout          the rollout settings its paper adds to that protocol, as config keys
                   (`{"mode": "tree", "tree": {"branch_factor": 2}}`); `rollout_mode` is the kind
                   of rollout it needs ("independent", "tree" or "arpo")
  loss             its paper's loss settings, `LossOptions` fields (DAPO's clip-higher and token
                   mean); with `aggregation="seq_mean_token_sum_norm"` the reader sets
                   `norm_constant` to its longest row
  group_normalised whether its advantage is a group z-score or deviation of a per-row reward, so
                   that an all-equal or singleton group gets exactly 0 (`tests/test_estimators.py`)

Readers: the configs (`configs/base.py` `registered`, and `configs/estimator.py` for an estimator
without a config file of its own), the credit bench's cells (`tirjax/credit/cells.py`
`default_loss`), the tree estimators of `tirjax/credit/rollout_fidelity.py` and
`benchmarks/bench_kernels.py`, the tests, and the table of docs/formulas.md
(`tirjax/reporting/estimator_table.py`). Estimator modules are found without a list: every
module of this package (and of any `tirjax/advantages/` folder on `sys.path`) is imported by
`tirjax/advantages/__init__.py`, so a new estimator is its kernel, its reference and its test
(docs/adding_an_estimator.md).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import types
from typing import Any, Callable, Mapping

import jax

from tirjax import spec_sections
from tirjax.rollouts import Advantages, Rollouts  # noqa: F401  (Advantages: re-exported)


PROTOCOLS = ("portool", "hidifftir")  # configs/base.py's `<name>_protocol()`


def _frozen(mapping: Mapping | None, what: str) -> Mapping:
  """A read-only copy of nested config values (a registration is shared by every reader)."""
  if mapping is None:
    return types.MappingProxyType({})
  if not isinstance(mapping, Mapping):
    raise TypeError(f"{what}: expected a mapping of config keys, got {mapping!r}")
  return types.MappingProxyType({k: _frozen(v, f"{what}.{k}") if isinstance(v, Mapping) else v
                                 for k, v in mapping.items()})


def thawed(mapping: Mapping) -> dict:
  """A plain, nested dict of a registration's `rollout` or `loss` (for the config builders)."""
  return {k: thawed(v) if isinstance(v, Mapping) else v for k, v in mapping.items()}


@dataclasses.dataclass(frozen=True)
class Estimator:
  name: str
  fn: Callable[[Rollouts, Any], Advantages]
  options: type
  spec: str | None = None  # the docs/spec.md section that defines it (documentation only)
  needs: tuple[str, ...] = ()
  # Its protocol (the module docstring): read by configs, cells, benches, tests and docs.
  reference: str = ""
  protocol: str = "portool"
  rollout: Mapping = dataclasses.field(default_factory=dict, hash=False)
  loss: Mapping = dataclasses.field(default_factory=dict, hash=False)
  group_normalised: bool = False

  @property
  def rollout_mode(self) -> str:
    """The kind of rollout it trains on: "independent", "tree" or "arpo"."""
    return self.rollout.get("mode", "independent")

  @property
  def reference_fn(self) -> Callable[..., dict]:
    """Its loop reference, `ref(batch, **options) -> dict(steps=[B, T], rows=[B], ...)`,
    imported on first use (the kernels never import the references)."""
    module, _, attr = self.reference.partition(":")
    try:
      return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
      raise LookupError(f"advantage estimator '{self.name}': its reference "
                        f"'{self.reference}' is not found ({e})") from None

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


def register(name: str, options: type, *, reference: str, spec: str | None = None,
             needs: tuple[str, ...] = (), protocol: str = "portool",
             rollout: Mapping | None = None, loss: Mapping | None = None,
             group_normalised: bool = False):
  """Decorator on `fn(rollouts, options) -> Advantages`:

      @register("dapo", DAPOOptions, reference="tirjax.testing.reference.group:dapo",
                spec="4.3", loss=dict(clip_high=0.28, aggregation="token_mean"),
                group_normalised=True)

  `reference` ("module:function"): its loop reference; `spec` (optional): the docs/spec.md
  section that defines it, which must exist; `needs`: the optional `Rollouts` fields that `fn`
  always reads; `protocol`, `rollout`, `loss`, `group_normalised`: its protocol (the module
  docstring)."""
  where = f"advantage estimator '{name}'"
  if not (isinstance(reference, str) and reference.count(":") == 1 and
          all(reference.split(":"))):
    raise ValueError(f"{where}: reference={reference!r}, expected 'module:function' "
                     "(e.g. 'tirjax.testing.reference.group:grpo')")
  if protocol not in PROTOCOLS:
    raise ValueError(f"{where}: protocol={protocol!r}, expected one of {PROTOCOLS}")
  frozen_rollout, frozen_loss = _frozen(rollout, "rollout"), _frozen(loss, "loss")

  def wrap(fn):
    if name in _REGISTRY:
      raise ValueError(f"advantage estimator '{name}' is registered twice")
    spec_sections.check(spec, where)
    if not (dataclasses.is_dataclass(options) and options.__dataclass_params__.frozen):
      raise TypeError(f"options of '{name}' must be a frozen dataclass (hashable, static)")
    _REGISTRY[name] = Estimator(name, fn, options, spec, tuple(needs), reference, protocol,
                                frozen_rollout, frozen_loss, bool(group_normalised))
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
