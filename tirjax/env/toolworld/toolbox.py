"""The toolworld tools: look-ups bound to one query's world, and pure utilities.

Every tool has a JSON schema and raises `ToolError` with an explicit message on bad input (also
when called directly, without a schema check). Outputs are compact JSON values: a string, a
number or a list of strings. Numbers come back as ints when integral, else rounded (convert to
1 decimal, calculate to 2), so that a model can copy them and a verifier can compare them.
"""

from __future__ import annotations

import datetime
import math
from typing import Any, Callable, Mapping, Optional, Sequence

from tirjax.env.chat import RESPONSE_GEN
from tirjax.env.tools import Tool, ToolError
from tirjax.env.toolworld.world import CITY_FIELDS, COMPANY_FIELDS, PERSON_FIELDS, World, pair_key

UNAVAILABLE = "service unavailable"
OPS = ("add", "sub", "mul", "div")
_ARITHMETIC: dict[str, Callable[[float, float], float]] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b, "div": lambda a, b: a / b}
UNITS = ("c", "f", "km", "mi", "m", "ft", "kg", "lb")
_CONVERSIONS: dict[tuple[str, str], Callable[[float], float]] = {
    ("c", "f"): lambda v: v * 9 / 5 + 32, ("f", "c"): lambda v: (v - 32) * 5 / 9,
    ("km", "mi"): lambda v: v / 1.609344, ("mi", "km"): lambda v: v * 1.609344,
    ("m", "ft"): lambda v: v / 0.3048, ("ft", "m"): lambda v: v * 0.3048,
    ("kg", "lb"): lambda v: v / 0.45359237, ("lb", "kg"): lambda v: v * 0.45359237,
}


def clean_number(x: float, digits: int) -> float | int:
  """Rounded to `digits` decimals; an int when integral (so 4.0 comes back as 4)."""
  if not math.isfinite(x):
    raise ToolError(f"the result is out of range: {x}")
  x = round(x, digits)
  return int(x) if x == int(x) else x


def _str(v: Any, what: str) -> str:
  if not isinstance(v, str) or not v:
    raise ToolError(f"{what} must be a non-empty string, got {v!r}")
  return v


def _num(v: Any, what: str) -> float:
  if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
    raise ToolError(f"{what} must be a number, got {v!r}")
  return v


def _choice(v: Any, what: str, options: Sequence[str]) -> str:
  if v not in options:
    raise ToolError(f"{what} must be one of {', '.join(options)}, got {v!r}")
  return v


def _items(v: Any) -> dict[str, float]:
  if not isinstance(v, Mapping) or len(v) < 2:
    raise ToolError("items must be an object mapping at least 2 labels to numbers")
  return {k: _num(x, f"items[{k!r}]") for k, x in v.items()}


def _date(v: Any, what: str) -> datetime.date:
  try:
    return datetime.date.fromisoformat(_str(v, what))
  except ValueError:
    raise ToolError(f"{what} must be a date YYYY-MM-DD, got {v!r}") from None


def _lookup(table: Mapping[str, Mapping[str, Any]], kind: str, fields: Sequence[str]):
  def fn(name, field):
    entry = table.get(_str(name, "name"))
    if entry is None:
      raise ToolError(f"unknown {kind}: {name}")
    return entry[_choice(field, "field", fields)]
  return fn


def _calculate(op, a, b):
  op, a, b = _choice(op, "op", OPS), _num(a, "a"), _num(b, "b")
  if op == "div" and b == 0:
    raise ToolError("division by zero")
  return clean_number(_ARITHMETIC[op](a, b), 2)


def _convert(value, from_unit, to_unit):
  value = _num(value, "value")
  key = (_choice(from_unit, "from_unit", UNITS), _choice(to_unit, "to_unit", UNITS))
  if key not in _CONVERSIONS:
    raise ToolError(f"cannot convert {from_unit} to {to_unit}")
  return clean_number(_CONVERSIONS[key](value), 1)


def _compare(items, mode):
  items, mode = _items(items), _choice(mode, "mode", ("max", "min"))
  return (max if mode == "max" else min)(items, key=items.get)


def _sort_list(items, order):
  items, order = _items(items), _choice(order, "order", ("asc", "desc"))
  return sorted(items, key=items.get, reverse=order == "desc")


def _filter_list(items, op, value):
  items, op, value = _items(items), _choice(op, "op", ("gt", "lt")), _num(value, "value")
  return [k for k, x in items.items() if (x > value if op == "gt" else x < value)]


def _date_diff(start, end):
  return (_date(end, "end") - _date(start, "start")).days


def _enum(options: Sequence[str]) -> dict:
  return {"type": "string", "enum": list(options)}


def _schema(props: dict[str, Any]) -> dict:
  return {"type": "object", "properties": props, "required": list(props),
          "additionalProperties": False}


_STR, _NUM = {"type": "string"}, {"type": "number"}
_ITEMS = {"type": "object", "additionalProperties": {"type": "number"}, "minProperties": 2}

# name -> (description, schema); the order is the order in the system prompt.
SPECS: dict[str, tuple[str, dict]] = {
    "person_info": ("A person's city, company or birth date (born).",
                    _schema({"name": _STR, "field": _enum(PERSON_FIELDS)})),
    "company_info": ("A company's head-quarters city (hq), revenue ($M) or staff count.",
                     _schema({"name": _STR, "field": _enum(COMPANY_FIELDS)})),
    "city_info": ("A city's population, temperature in C (temp_c) or elevation in m.",
                  _schema({"name": _STR, "field": _enum(CITY_FIELDS)})),
    "distance": ("Distance in km between two cities.",
                 _schema({"city_a": _STR, "city_b": _STR})),
    "calculate": ("Apply op to a and b.",
                  _schema({"op": _enum(OPS), "a": _NUM, "b": _NUM})),
    "convert": ("Convert a value between units.",
                _schema({"value": _NUM, "from_unit": _enum(UNITS),
                         "to_unit": _enum(UNITS)})),
    "compare": ("The label with the largest (max) or smallest (min) value.",
                _schema({"items": _ITEMS, "mode": _enum(("max", "min"))})),
    "sort_list": ("Labels sorted by value.",
                  _schema({"items": _ITEMS, "order": _enum(("asc", "desc"))})),
    "filter_list": ("Labels whose value is greater (gt) or less (lt) than value.",
                    _schema({"items": _ITEMS, "op": _enum(("gt", "lt")), "value": _NUM})),
    "date_diff": ("Days from start to end (dates YYYY-MM-DD).",
                  _schema({"start": _STR, "end": _STR})),
}
TOOL_NAMES = tuple(SPECS)


def _guarded(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
  """Missing or unexpected arguments become a ToolError instead of a TypeError."""
  params = fn.__code__.co_varnames[:fn.__code__.co_argcount]

  def call(**arguments):
    missing = [p for p in params if p not in arguments]
    extra = [a for a in arguments if a not in params]
    if missing or extra:
      raise ToolError(f"{name}: missing arguments {missing}, unexpected arguments {extra}")
    return fn(**arguments)
  return call


def _unavailable(**_):
  raise ToolError(UNAVAILABLE)


def make_tools(world: World, down: Optional[str] = None) -> list[Tool]:
  """The tools of one query (and `response_gen` last); the `down` tool always errors."""
  if down is not None and down not in SPECS:
    raise ValueError(f"down: unknown tool {down!r}; choose from {TOOL_NAMES}")

  def distance(city_a, city_b):
    for what, c in (("city_a", city_a), ("city_b", city_b)):
      if _str(c, what) not in world.cities:
        raise ToolError(f"unknown city: {c}")
    return 0 if city_a == city_b else world.distances[pair_key(city_a, city_b)]

  fns = {
      "person_info": _lookup(world.people, "person", PERSON_FIELDS),
      "company_info": _lookup(world.companies, "company", COMPANY_FIELDS),
      "city_info": _lookup(world.cities, "city", CITY_FIELDS),
      "distance": distance, "calculate": _calculate, "convert": _convert, "compare": _compare,
      "sort_list": _sort_list, "filter_list": _filter_list, "date_diff": _date_diff,
  }
  tools = [Tool(name, description, schema,
                _unavailable if name == down else _guarded(name, fns[name]))
           for name, (description, schema) in SPECS.items()]
  return tools + [RESPONSE_GEN]
