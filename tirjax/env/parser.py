"""Parsing an assistant step and the first four formatting checks (spec §4.1, §6).

A step (its text without the end-of-turn token) is::

    <think>…</think> <tool_call>[{"name": …, "arguments": {…}}, …]</tool_call>

or, under `answer_protocol="answer_tag"`, `<think>…</think> <answer>…</answer>` for the
final step; whitespace may surround the blocks. The checks, in order, each failing all later
ones: (1) a `<think>…</think>` block, (2) a `<tool_call>…</tool_call>` (or `<answer>`) block,
(3) its content parses as a JSON array of `{"name", "arguments"}` objects within `ParseLimits`,
whose name and argument names are ASCII identifiers (a verdict may be computed from call
strings built of them, so anything else is a malformed call: spec §6, Verdicts; non-ASCII
ones too, as Python's eval would fold them to other names than the live call uses),
(4) every call names a known tool and its arguments satisfy the tool's JSON schema, (5) every
call executed without error (checked by the executor). An answer step has no calls, so it
passes checks 3-5 vacuously. Every failure carries a specific message for the agent.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Optional, Sequence

from tirjax import option_checks
from tirjax.env import schemas
from tirjax.env.tools import ANSWER_PROTOCOLS, TERMINAL_TOOL, Tool, is_call_name

NUM_CHECKS = 5
THINK, TOOL_CALL, ANSWER = ("<think>", "</think>"), ("<tool_call>", "</tool_call>"), (
    "<answer>", "</answer>")


def format_reward(checks_passed: int) -> float:
  """R_fm = 0.25 · (2 · passed / 5 − 1) ∈ [-0.25, 0.25] (PORTool, spec §4.1)."""
  if not 0 <= checks_passed <= NUM_CHECKS:
    raise ValueError(f"checks_passed: must lie in [0, {NUM_CHECKS}], got {checks_passed}")
  return 0.25 * (2.0 * checks_passed / NUM_CHECKS - 1.0)


@dataclasses.dataclass(frozen=True)
class ParseLimits:
  max_chars: int = 32_768  # characters inside <tool_call>…</tool_call>
  max_depth: int = 16  # JSON nesting depth, the outer array counting 1
  max_calls: int = 8  # calls per step
  max_arguments: int = 32  # top-level arguments per call

  def __post_init__(self):
    for name in ("max_chars", "max_calls", "max_arguments"):
      option_checks.at_least(name, getattr(self, name), 1)
    option_checks.at_least("max_depth", self.max_depth, 3, why="array, call, arguments")


@dataclasses.dataclass
class ParsedStep:
  """Checks 1-4 of one step; `error` says why the first failed check failed."""

  checks_passed: int  # 0..4; the executor adds check 5
  think: Optional[str] = None
  calls: list = dataclasses.field(default_factory=list)  # [{"name", "arguments"}] in order
  call_errors: list = dataclasses.field(default_factory=list)  # check-4 message or None, per call
  answer: Optional[str] = None  # the <answer> text (answer_tag protocol)
  error: Optional[str] = None


def snippet(text: str, limit: int = 40) -> str:
  """A short, printable quote of model text (unpaired surrogates escaped)."""
  text = text if len(text) <= limit else text[:limit] + "…"
  return json.dumps(text.encode("utf-8", "backslashreplace").decode("utf-8"),
                    ensure_ascii=False)


class _InvalidJson(ValueError):
  pass


def _no_duplicates(pairs):
  out = {}
  for k, v in pairs:
    if k in out:
      raise _InvalidJson(f"duplicate key {snippet(k)} in a JSON object")
    out[k] = v
  return out


def _no_constants(name):
  raise _InvalidJson(f"{name} is not valid JSON")


def _finite(text):
  value = float(text)
  if not math.isfinite(value):
    raise _InvalidJson(f"the number {text[:20]} is out of range")
  return value


def _int64(text):
  # Checked on the digits first: int() of thousands of digits fails with Python's own hint
  # about sys.set_int_max_str_digits, which means nothing to the policy.
  value = int(text) if len(text.lstrip("-")) <= 19 else None
  if value is None or not -2**63 <= value < 2**63:
    raise _InvalidJson(f"the integer {text[:20]}… ({len(text.lstrip('-'))} digits) is out of "
                       "range (64-bit integers only)")
  return value


def _depth(value: Any, limit: int) -> int:
  """Nesting depth of a decoded JSON value, counted up to `limit + 1`."""
  deepest, stack = 0, [(value, 1)]
  while stack:
    v, d = stack.pop()
    if isinstance(v, (list, dict)):
      deepest = max(deepest, d)
      if deepest > limit:
        return deepest
      stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
  return deepest


def _unpaired_surrogate(value: Any) -> Optional[str]:
  stack = [value]
  while stack:
    v = stack.pop()
    if isinstance(v, str):
      bad = next((c for c in v if "\ud800" <= c <= "\udfff"), None)
      if bad is not None:
        return f"\\u{ord(bad):04x}"
    elif isinstance(v, dict):
      stack.extend(v.keys())
      stack.extend(v.values())
    elif isinstance(v, list):
      stack.extend(v)
  return None


class StepParser:
  """Parses steps against one task's tools. Reuse it for every step of the task's episodes."""

  def __init__(self, tools: Sequence[Tool], answer_protocol: str = "response_gen",
               limits: ParseLimits = ParseLimits()):
    if answer_protocol not in ANSWER_PROTOCOLS:
      raise ValueError(f"answer_protocol: must be one of {ANSWER_PROTOCOLS}, got "
                       f"{answer_protocol!r}")
    self.answer_protocol = answer_protocol
    self.limits = limits
    self.tools = {t.name: t for t in tools}
    if len(self.tools) != len(tools):
      raise ValueError("tools: names must be distinct")
    for t in tools:
      try:
        schemas.validator(t.parameters)
      except Exception as e:  # noqa: BLE001 - any schema problem is a dataset bug
        raise ValueError(f"tool {t.name!r}: invalid JSON schema for its parameters: {e}") from e
    self._known = ", ".join(sorted(self.tools)) or "(none)"

  def parse(self, text: str) -> ParsedStep:
    """Never raises for any `text`."""
    think, rest, error = self._think(text)
    if error:
      return ParsedStep(0, error=error)
    kind, body, error = self._block(rest)
    if error:
      return ParsedStep(1, think=think, error=error)
    if kind == "answer":
      return ParsedStep(4, think=think, answer=body.strip())
    calls, error = self._calls(body)
    if error:
      return ParsedStep(2, think=think, error=error)
    call_errors = [self._check_call(i, c) for i, c in enumerate(calls, 1)]
    bad = [e for e in call_errors if e]
    return ParsedStep(3 if bad else 4, think=think, calls=calls, call_errors=call_errors,
                      error="; ".join(bad) if bad else None)

  # -- check 1 ----------------------------------------------------------------------------

  def _think(self, text: str):
    start = len(text) - len(text.lstrip())
    if not text.startswith(THINK[0], start):
      if not text.strip():
        return None, "", "empty step: expected <think>…</think> followed by a <tool_call> block"
      where = text.find(THINK[0])
      if where < 0:
        return None, "", "missing <think>…</think> block: the step must begin with <think>"
      return None, "", (f"unexpected text before <think>: {snippet(text[start:where])}; "
                        "the step must begin with <think>")
    end = text.find(THINK[1], start + len(THINK[0]))
    if end < 0:
      return None, "", "unclosed <think>: no </think> follows (truncated step?)"
    return text[start + len(THINK[0]):end], text[end + len(THINK[1]):], None

  # -- check 2 ----------------------------------------------------------------------------

  def _block(self, rest: str):
    rest = rest.lstrip()
    answer_ok = self.answer_protocol == "answer_tag"
    expected = "<tool_call> or <answer>" if answer_ok else "<tool_call>"
    if rest.startswith(ANSWER[0]):
      if not answer_ok:
        return None, None, ("<answer> is not used under the response_gen protocol: call "
                            f"{TERMINAL_TOOL} with {{\"answer\": …}} inside a <tool_call> block")
      return self._tagged(rest, ANSWER, "answer")
    if rest.startswith(TOOL_CALL[0]):
      return self._tagged(rest, TOOL_CALL, "tool_call")
    if not rest:
      return None, None, f"missing {expected} block after </think>"
    return None, None, f"expected {expected} after </think>, found {snippet(rest)}"

  def _tagged(self, rest: str, tags, kind: str):
    open_tag, close_tag = tags
    end = rest.find(close_tag, len(open_tag))
    if end < 0:
      return None, None, f"unclosed {open_tag}: no {close_tag} follows (truncated step?)"
    tail = rest[end + len(close_tag):].strip()
    if tail.startswith(open_tag):
      return None, None, (f"more than one {open_tag} block; put all calls of a step in one "
                          f"JSON array inside a single {open_tag} block" if kind == "tool_call"
                          else f"more than one {open_tag} block")
    if close_tag in tail:
      return None, None, (f"{close_tag} appears twice: the first one ends the block, so an "
                          f"argument cannot contain it (write {close_tag.replace('/', chr(92) + '/')}"
                          " inside a JSON string)")
    if tail:
      return None, None, f"unexpected text after {close_tag}: {snippet(tail)}"
    return kind, rest[len(open_tag):end], None

  # -- check 3 ----------------------------------------------------------------------------

  def _calls(self, body: str):
    lim = self.limits
    if len(body) > lim.max_chars:
      return None, (f"the <tool_call> content has {len(body)} characters; the limit is "
                    f"{lim.max_chars}")
    if not body.strip():
      return None, "the <tool_call> block is empty: expected a JSON array of calls"
    try:
      value = json.loads(body, object_pairs_hook=_no_duplicates, parse_constant=_no_constants,
                         parse_float=_finite, parse_int=_int64)
    except json.JSONDecodeError as e:
      return None, (f"invalid JSON in <tool_call> at line {e.lineno} column {e.colno} "
                    f"(char {e.pos}): {e.msg}")
    except ValueError as e:  # ours, or Python's limit on the digits of an integer
      return None, f"invalid JSON in <tool_call>: {e}"
    except RecursionError:
      return None, f"the JSON in <tool_call> nests deeper than the limit of {lim.max_depth}"
    if isinstance(value, dict):
      return None, ("expected a JSON array of calls, got a single object; wrap it in [ ] "
                    "even for one call")
    if not isinstance(value, list):
      return None, f"expected a JSON array of calls, got {schemas.json_type(value)}"
    if not value:
      return None, "the array of calls is empty; a step needs at least one call"
    if len(value) > lim.max_calls:
      return None, f"{len(value)} calls in one step; the limit is {lim.max_calls}"
    if _depth(value, lim.max_depth) > lim.max_depth:
      return None, f"the JSON in <tool_call> nests deeper than the limit of {lim.max_depth}"
    for i, call in enumerate(value, 1):
      error = self._call_shape(i, call)
      if error:
        return None, error
    return [{"name": c["name"], "arguments": c["arguments"]} for c in value], None

  def _call_shape(self, i: int, call: Any) -> Optional[str]:
    if not isinstance(call, dict):
      return (f"call {i}: expected an object {{\"name\": …, \"arguments\": {{…}}}}, got "
              f"{schemas.json_type(call)}")
    if "name" not in call:
      return f"call {i}: missing \"name\""
    name = call["name"]
    if not isinstance(name, str):
      return f"call {i}: \"name\" must be a string, got {schemas.json_type(name)}"
    label = f"call {i} ({snippet(name)})"
    if not is_call_name(name):
      return (f"{label}: the tool name is not an identifier (ASCII letters, digits and _, not "
              "a digit first)")
    extra = sorted(set(call) - {"name", "arguments"})
    if extra:
      return (f"{label}: unexpected key {', '.join(snippet(k) for k in extra)}; a call has "
              "exactly \"name\" and \"arguments\"")
    if "arguments" not in call:
      return f"{label}: missing \"arguments\" (use {{}} for a tool without arguments)"
    args = call["arguments"]
    if not isinstance(args, dict):
      hint = ""
      if isinstance(args, str):
        try:
          json.loads(args)
          hint = " (it is a JSON-encoded string; give the object itself)"
        except (ValueError, RecursionError):
          pass
      return f"{label}: \"arguments\" must be a JSON object, got {schemas.json_type(args)}{hint}"
    if len(args) > self.limits.max_arguments:
      return f"{label}: {len(args)} arguments; the limit is {self.limits.max_arguments}"
    names = [k for k in args if not is_call_name(k)]
    if names:  # a verdict is computed from call strings built of these names (spec §6)
      return (f"{label}: the argument name {snippet(names[0])} is not an identifier (ASCII "
              "letters, digits and _, not a digit first)")
    bad = _unpaired_surrogate(call)
    if bad:
      return f"{label}: a string contains the unpaired surrogate {bad}, which is not Unicode"
    return None

  # -- check 4 ----------------------------------------------------------------------------

  def _check_call(self, i: int, call: dict) -> Optional[str]:
    name = call["name"]
    tool = self.tools.get(name)
    label = f"call {i} ({snippet(name)})"
    if tool is None:
      hint = (f"; end the episode with <answer>…</answer> instead"
              if name == TERMINAL_TOOL and self.answer_protocol == "answer_tag" else "")
      return f"{label}: unknown tool; known tools: {self._known}{hint}"
    problems = schemas.check_arguments(tool.parameters, call["arguments"])
    return f"{label}: {'; '.join(problems)}" if problems else None
