"""Checks of single option values, for the `__post_init__` of every options dataclass.

Each check takes the option's name and value (and its bounds or choices) and raises ValueError
with the one message format the trainer's config errors quote:
`"{name}: must <requirement>[ (<why>)], got {value!r}"`, e.g.
`"temperature: must be >= 0, got -1.0"`. Checks that compare reject a bool (a mistyped
switch, never a count or a rate), NaN, and a value that cannot be compared (a string), so bad
input always fails with the option's name rather than a TypeError later. Checks that involve
two options (`initial_rollouts <= total_rollouts`) stay with their dataclass.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import typing
from typing import Any, Callable, Iterable


def _reject(name: str, requirement: str, value: Any, why: str = "") -> None:
  because = f" ({why})" if why else ""
  raise ValueError(f"{name}: must {requirement}{because}, got {value!r}")


def _holds(compare: Callable[[Any, Any], Any], value: Any, bound: Any) -> bool:
  """`compare(value, bound)`, False for a bool or a value that does not compare (NaN never
  does)."""
  if isinstance(value, bool):
    return False
  try:
    return bool(compare(value, bound))
  except TypeError:
    return False


def is_finite_number(value: Any) -> bool:
  """An int or float (not a bool) that is neither NaN nor infinite."""
  return (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value))


def one_of(name: str, value: Any, allowed: Iterable) -> None:
  """`value` is one of `allowed` (a tuple, or a dict's keys)."""
  if value not in allowed:
    _reject(name, f"be one of {tuple(allowed)}", value)


@functools.cache
def choices_of(cls: type) -> dict[str, tuple]:
  """{field: its allowed values} of the dataclass `cls`'s fields typed `Literal[...]`."""
  hints = typing.get_type_hints(cls)
  return {f.name: typing.get_args(hints[f.name]) for f in dataclasses.fields(cls)
          if typing.get_origin(hints[f.name]) is typing.Literal}


def typed_choices(options: Any) -> None:
  """Every field of the dataclass instance `options` typed `Literal[...]` holds one of its
  values: `"{field}: must be one of (...), got {value!r}"`, naming the first one that does not."""
  for name, allowed in choices_of(type(options)).items():
    one_of(name, getattr(options, name), allowed)


def flag(name: str, value: Any) -> None:
  """`value` is True or False (not 0 or 1, not "true")."""
  if not isinstance(value, bool):
    _reject(name, "be True or False", value)


def int_at_least(name: str, value: Any, low: int) -> None:
  """`value` is an int (not a bool, not a float) >= `low`."""
  if isinstance(value, bool) or not isinstance(value, int) or value < low:
    _reject(name, f"be an integer >= {low}", value)


def at_least(name: str, value: Any, low: Any, why: str = "") -> None:
  """`value` >= `low`."""
  if not _holds(operator.ge, value, low):
    _reject(name, f"be >= {low}", value, why)


def above(name: str, value: Any, low: Any, why: str = "") -> None:
  """`value` > `low`."""
  if not _holds(operator.gt, value, low):
    _reject(name, f"be > {low}", value, why)


def at_most(name: str, value: Any, high: Any, why: str = "") -> None:
  """`value` <= `high` (an upper limit, e.g. the tasks a run may ask for)."""
  if not _holds(operator.le, value, high):
    _reject(name, f"be <= {high}", value, why)


def lies_in(name: str, value: Any, low: Any, high: Any, *, open_low: bool = False,
            open_high: bool = False) -> None:
  """`value` lies in the interval from `low` to `high`, closed unless `open_low` /
  `open_high`: [low, high], (low, high], [low, high) or (low, high)."""
  ok = (_holds(operator.gt if open_low else operator.ge, value, low)
        and _holds(operator.lt if open_high else operator.le, value, high))
  if not ok:
    interval = f"{'(' if open_low else '['}{low}, {high}{')' if open_high else ']'}"
    _reject(name, f"lie in {interval}", value)


def finite_at_least(name: str, value: Any, low: float, why: str = "") -> None:
  """`value` is a finite number (`is_finite_number`) >= `low`."""
  if not (is_finite_number(value) and value >= low):
    _reject(name, f"be a finite number >= {low}", value, why)


def finite_above(name: str, value: Any, low: float, *, none_ok: bool = False) -> None:
  """`value` is a finite number (`is_finite_number`) > `low`, or None when `none_ok`."""
  if none_ok and value is None:
    return
  if not (is_finite_number(value) and value > low):
    _reject(name, f"be {'None or ' if none_ok else ''}a finite number > {low}", value)
