"""Bridges between ml_collections configs and the library's frozen option dataclasses.

Each component's options are a frozen dataclass whose defaults are the spec's and whose
`__post_init__` rejects bad values. A config section is generated from that dataclass (so the
config lists every option, and a mistyped key fails on the locked config), and turned back
into the dataclass before any compute (so an invalid value fails early, naming the key).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Collection, Mapping

import ml_collections


def config_from_dataclass(obj_or_cls, omit: Collection[str] = ()) -> ml_collections.ConfigDict:
  """A ConfigDict with one entry per field (nested dataclasses become nested sections), but
  the dotted fields in `omit` (values derived from other sections, e.g. "demos.answer_protocol")."""
  obj = obj_or_cls() if isinstance(obj_or_cls, type) else obj_or_cls
  out = ml_collections.ConfigDict()
  for f in dataclasses.fields(obj):
    if f.name in omit:
      continue
    value = getattr(obj, f.name)
    if dataclasses.is_dataclass(value):
      inner = [k.split(".", 1)[1] for k in omit if k.startswith(f"{f.name}.")]
      out[f.name] = config_from_dataclass(value, inner)
    elif isinstance(value, tuple):
      out[f.name] = list(value) if not value else value
    else:
      out[f.name] = value
  return out


def dataclass_from_config(cls, section: Mapping[str, Any] | None, where: str = ""):
  """Builds `cls` from a config section; unknown keys and invalid values name the key."""
  section = dict(section or {})
  hints = typing.get_type_hints(cls)
  known = {f.name: f for f in dataclasses.fields(cls)}
  unknown = sorted(set(section) - set(known))
  if unknown:
    raise ValueError(f"{where or cls.__name__}: unknown key(s) {unknown}; valid keys are "
                     f"{sorted(known)}")
  kwargs = {}
  for name, value in section.items():
    key = f"{where}.{name}" if where else name
    default = _field_default(known[name])
    if dataclasses.is_dataclass(default) and isinstance(value, Mapping | ml_collections.ConfigDict):
      value = dataclass_from_config(type(default), value, key)
    elif isinstance(value, list) and hints.get(name) is not None and "tuple" in str(hints[name]):
      value = tuple(value)
    kwargs[name] = value
  try:
    return cls(**kwargs)
  except (ValueError, TypeError) as e:
    raise ValueError(f"{where or cls.__name__}: {e}") from None


def _field_default(f: dataclasses.Field):
  if f.default is not dataclasses.MISSING:
    return f.default
  if f.default_factory is not dataclasses.MISSING:
    return f.default_factory()
  return None


def parse_preset_arg(arg: str | None, allowed: Mapping[str, tuple[str, ...] | None]) -> dict:
  """Parses `"model=tiny,env=toolworld"`; `allowed[key]` lists valid values (None: free)."""
  out: dict[str, str] = {}
  if not arg:
    return out
  for item in arg.split(","):
    item = item.strip()
    if not item:
      continue
    if "=" not in item:
      raise ValueError(f"config argument '{item}': expected key=value (e.g. model=tiny)")
    key, value = (s.strip() for s in item.split("=", 1))
    if key not in allowed:
      raise ValueError(f"config argument: unknown preset key '{key}'; valid keys are "
                       f"{sorted(allowed)}")
    if allowed[key] is not None and value not in allowed[key]:
      raise ValueError(f"config argument {key}={value}: valid values are {list(allowed[key])}")
    out[key] = value
  return out


def get_key(config: Mapping[str, Any], key: str) -> Any:
  """The value of a dotted `key` ("sft.demos.p_confuse") in a ConfigDict or nested dicts."""
  for part in key.split("."):
    config = config[part]
  return config


def set_key(config, key: str, value: Any) -> None:
  """Sets a dotted `key` of a ConfigDict or of nested dicts."""
  parent, _, leaf = key.rpartition(".")
  (get_key(config, parent) if parent else config)[leaf] = value
