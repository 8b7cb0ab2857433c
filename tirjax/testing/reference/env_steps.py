"""Reference count of the five formatting checks of a step (spec §4.1), written from the SPEC.

Regular expressions for the blocks, a recursive walk for the JSON limits and hand-written
checks of flat schemas (`{"a": "integer", ...}`, all required, nothing else allowed), sharing
no code with `tirjax.env`. A block runs from its opening tag to the first closing tag, and only
whitespace may follow it.
"""

import json
import math
import re

THINK = re.compile(r"\s*<think>(.*?)</think>(.*)\Z", re.S)
TOOL_CALL = re.compile(r"\s*<tool_call>(.*?)</tool_call>(.*)\Z", re.S)
ANSWER = re.compile(r"\s*<answer>(.*?)</answer>(.*)\Z", re.S)
PY_TYPES = {"integer": lambda v: type(v) is int, "string": lambda v: type(v) is str,
            "number": lambda v: type(v) in (int, float), "boolean": lambda v: type(v) is bool}


def _depth(v):
  if isinstance(v, list):
    return 1 + max([_depth(x) for x in v], default=0)
  if isinstance(v, dict):
    return 1 + max([_depth(x) for x in v.values()], default=0)
  return 0


def _has_surrogate(v):
  if isinstance(v, str):
    return any(0xD800 <= ord(c) <= 0xDFFF for c in v)
  if isinstance(v, list):
    return any(_has_surrogate(x) for x in v)
  if isinstance(v, dict):
    return any(_has_surrogate(k) or _has_surrogate(x) for k, x in v.items())
  return False


def _strict_json(body):
  def pairs(kv):
    keys = [k for k, _ in kv]
    if len(set(keys)) != len(keys):
      raise ValueError("duplicate")
    return dict(kv)

  def const(name):
    raise ValueError(name)

  def finite(text):
    if not math.isfinite(float(text)):
      raise ValueError(text)
    return float(text)

  def int64(text):
    v = int(text)
    if v < -(1 << 63) or v > (1 << 63) - 1:
      raise ValueError(text)
    return v

  return json.loads(body, object_pairs_hook=pairs, parse_constant=const, parse_float=finite,
                    parse_int=int64)


def checks_passed(text, schemas, failing, protocol="response_gen", max_chars=32768,
                  max_depth=16, max_calls=8, max_arguments=32):
  """Number of checks passed. `schemas`: {tool: {arg: type}}; `failing`: tools that fail."""
  m = THINK.match(text)
  if not m:
    return 0
  rest = m.group(2)
  if protocol == "answer_tag":
    a = ANSWER.match(rest)
    if a and not a.group(2).strip():
      return 5
  t = TOOL_CALL.match(rest)
  if not t or t.group(2).strip():
    return 1
  body = t.group(1)
  if len(body) > max_chars:
    return 2
  try:
    calls = _strict_json(body)
  except (ValueError, RecursionError):
    return 2
  if not isinstance(calls, list) or not 1 <= len(calls) <= max_calls:
    return 2
  if _depth(calls) > max_depth:
    return 2
  for c in calls:
    if not isinstance(c, dict) or set(c) != {"name", "arguments"}:
      return 2
    if not isinstance(c["name"], str) or not isinstance(c["arguments"], dict):
      return 2
    if len(c["arguments"]) > max_arguments or _has_surrogate(c):
      return 2
    if not all(n.isascii() and n.isidentifier()  # spec §6, Verdicts
               for n in [c["name"], *c["arguments"]]):
      return 2
  tools = dict(schemas)
  if protocol == "response_gen":
    tools["response_gen"] = {"answer": "string"}
  for c in calls:
    schema = tools.get(c["name"])
    if schema is None or set(c["arguments"]) != set(schema):
      return 3
    for arg, kind in schema.items():
      if not PY_TYPES[kind](c["arguments"][arg]):
        return 3
  names = [c["name"] for c in calls]
  if any(n in failing for n in names) or (protocol == "response_gen" and
                                          names.count("response_gen") > 1):
    return 4
  return 5


def format_reward(passed):
  return 0.25 * (2 * passed / 5 - 1)


assert math.isclose(format_reward(5), 0.25) and math.isclose(format_reward(0), -0.25)
