"""JSON-schema validation of tool arguments, with cached validators and readable errors.

A tool's `parameters` is a JSON schema; the dialect is the one its `$schema` names, Draft
2020-12 otherwise. Validators are built once per distinct schema (keyed by its canonical JSON).
Error messages name the argument and what is wrong with it, e.g.
`missing required argument 'city'` or `argument 'days': expected integer, got string "3"`.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Mapping

import jsonschema

_MAX_ERRORS = 3
_MAX_MESSAGE = 240


def _canonical(schema: Mapping[str, Any]) -> str:
  return json.dumps(schema, sort_keys=True, ensure_ascii=False)


@functools.lru_cache(maxsize=8192)
def _validator_from_json(schema_json: str):
  schema = json.loads(schema_json)
  cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
  cls.check_schema(schema)
  return cls(schema)


def validator(schema: Mapping[str, Any]):
  """The cached validator of `schema`; raises `jsonschema.SchemaError` for a bad schema."""
  return _validator_from_json(_canonical(schema))


def json_type(value: Any) -> str:
  """The JSON type name of a decoded JSON value."""
  if value is None:
    return "null"
  if isinstance(value, bool):
    return "boolean"
  if isinstance(value, int):
    return "integer"
  if isinstance(value, float):
    return "number"
  if isinstance(value, str):
    return "string"
  if isinstance(value, (list, tuple)):
    return "array"
  return "object" if isinstance(value, Mapping) else type(value).__name__


def _path(parts) -> str:
  out = ""
  for p in parts:
    out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
  return out


def _short(value: Any, limit: int = 60) -> str:
  text = json.dumps(value, ensure_ascii=False)
  return text if len(text) <= limit else text[:limit] + "…"


def _name(text: str) -> str:
  """An argument name in a message: 'city', or JSON-quoted when it holds a quote or an escape."""
  return f"'{text}'" if not any(c in text for c in "'\\\"\n") else json.dumps(text)


def describe(error: jsonschema.ValidationError) -> str:
  """One schema violation, naming the argument."""
  where = _path(error.absolute_path)
  prefix = f"{where}." if where else ""
  if error.validator == "required" and isinstance(error.instance, Mapping):
    missing = [p for p in error.validator_value if p not in error.instance]
    names = ", ".join(_name(f"{prefix}{p}") for p in missing)
    return f"missing required argument{'s' if len(missing) > 1 else ''} {names}"
  if error.validator == "additionalProperties" and isinstance(error.instance, Mapping):
    allowed = set((error.schema.get("properties") or {}))
    extra = sorted(k for k in error.instance if k not in allowed)
    names = ", ".join(_name(f"{prefix}{k}") for k in extra)
    return f"unexpected argument{'s' if len(extra) > 1 else ''} {names}"
  subject = f"argument {_name(where)}" if where else "arguments"
  if error.validator == "type":
    want = error.validator_value
    want = " or ".join(want) if isinstance(want, list) else want
    return (f"{subject}: expected {want}, got {json_type(error.instance)} "
            f"{_short(error.instance)}")
  if error.validator == "enum":
    return f"{subject}: {_short(error.instance)} is not one of {_short(error.validator_value)}"
  message = error.message
  if len(message) > _MAX_MESSAGE:
    message = message[:_MAX_MESSAGE] + "…"
  return f"{subject}: {message}"


def check_arguments(schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> list[str]:
  """The schema violations of `arguments` (at most a few), most shallow first; [] if valid."""
  errors = sorted(validator(schema).iter_errors(arguments),
                  key=lambda e: (len(e.absolute_path), [str(p) for p in e.absolute_path]))
  # jsonschema reports a missing argument once per missing name, each with the whole list:
  # one message per distinct description, and the count of the rest is of those.
  messages = list(dict.fromkeys(describe(e) for e in errors))
  out = messages[:_MAX_ERRORS]
  if len(messages) > _MAX_ERRORS:
    out.append(f"and {len(messages) - _MAX_ERRORS} more")
  return out
