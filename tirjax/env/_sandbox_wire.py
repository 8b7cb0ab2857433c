"""What the sandbox's owner and its workers agree on: the limits of a reply, and the check the
owner makes of every line before it trusts it (`_sandbox_worker.py` loads this file by path;
it imports nothing from tirjax).

A worker answers each request with one line of JSON:

  {"id": <the request's id>, "ok": true, "result": <JSON>, "stdout": str}
  {"id": <the request's id>, "ok": false, "error": str, "stdout": str}

and its first line, the answer to no request (id null), also carries "enforced": {str: bool}.
Tool code runs inside the worker, so a line is hostile until checked: `check_reply` reads at
most `max_bytes`, measures the nesting before parsing, and accepts only this schema.
"""

import itertools
import json
import re

MAX_DEPTH = 64  # nesting of a tool's result (lists and objects)
# A string, or what is left of an unclosed one: every quote starts a match, and nothing
# backtracks (possessive), so removing the strings takes linear time on any line.
_STRINGS = re.compile(rb'"(?:[^"\\]++|\\.|\\\Z)*+(?:"|\Z)', re.S)
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1
_NOT_BRACKETS = bytes(b for b in range(256) if not _STEP[b])


class ReplyError(ValueError):
  """A line that is not a reply to the request in flight."""


def held_to(text: str, limit: int) -> str:
  """`text` if it has at most `limit` characters, else its start and a note of its length,
  `limit` characters in all."""
  if len(text) <= limit:
    return text
  note = f" ... [{len(text)} characters, cut to {limit}]"
  return text[:limit - len(note)] + note if len(note) < limit else text[:limit]


def nesting_depth(data: bytes) -> int:
  """How deep the brackets of JSON text `data` nest (those inside strings not counted), in
  linear time and without recursion: the check that comes before `json.loads`."""
  brackets = _STRINGS.sub(b"", data).translate(None, _NOT_BRACKETS)
  return max(itertools.accumulate(map(_STEP.__getitem__, brackets), initial=0))


def deeper_than(data: bytes, depth: int) -> bool:
  """Whether JSON text `data` nests deeper than `depth`. Most lines open few brackets, and
  the count of opening ones bounds the depth: only lines with more are measured."""
  return data.count(b"[") + data.count(b"{") > depth and nesting_depth(data) > depth


def _refuse_constant(name):
  raise ReplyError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)  # NaN and Infinity are no JSON


def check_reply(line: bytes, request_id, max_bytes: int) -> dict:
  """The reply in `line` to request `request_id` (None: the start-up line), checked: at most
  `max_bytes`, nested at most MAX_DEPTH + 1 deep, and of the schema above. Raises
  ReplyError otherwise."""
  if len(line) > max_bytes:
    raise ReplyError(f"a reply of more than {max_bytes} bytes")
  if deeper_than(line, MAX_DEPTH + 1):
    raise ReplyError(f"a reply nested more than {MAX_DEPTH + 1} deep")
  try:
    reply = _DECODER.decode(line.decode("utf-8"))
  except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
    raise ReplyError(f"a reply that is not JSON ({type(e).__name__})") from None
  if not isinstance(reply, dict):
    raise ReplyError("a reply that is not a JSON object")
  if type(reply.get("id")) is not type(request_id) or reply["id"] != request_id:
    raise ReplyError(f"a reply to another request (id {str(reply.get('id'))[:20]})")
  ok = reply.get("ok")
  expected = {"id", "ok", "stdout", "result" if ok is True else "error"}
  if request_id is None:
    expected.add("enforced")
  if not isinstance(ok, bool) or set(reply) != expected:
    raise ReplyError(f"a reply whose keys are not {sorted(expected)}")
  if not isinstance(reply["stdout"], str) or not isinstance(reply.get("error", ""), str):
    raise ReplyError("a reply whose stdout or error is not a string")
  enforced = reply.get("enforced", {})
  if not (isinstance(enforced, dict) and all(isinstance(v, bool) for v in enforced.values())):
    raise ReplyError("a start-up line whose layers are not booleans")
  return reply
