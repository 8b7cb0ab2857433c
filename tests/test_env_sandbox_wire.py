"""The sandbox's wire checks (`_sandbox_wire`) and its tree removal (`_sandbox_files`) against
plain references, over random, ragged and degenerate inputs."""

import json
import os
import tempfile

import pytest
from hypothesis import given, settings, strategies as st

from tirjax.env import _sandbox_files as files
from tirjax.env import _sandbox_wire as wire

# Strings full of what a bracket scanner can trip on: brackets, quotes, backslashes.
tricky = st.text(alphabet='[]{}"\\\\ ,:ab\n\u00e9', max_size=12)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), tricky),
    lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(tricky, c, max_size=3)),
    max_leaves=40)


def depth(value) -> int:
  """Reference: nesting of lists and objects, by recursion on the decoded value."""
  if isinstance(value, list):
    return 1 + max([depth(v) for v in value], default=0)
  if isinstance(value, dict):
    return 1 + max([depth(v) for v in value.values()], default=0)
  return 0


@settings(max_examples=300)
@given(json_values, st.booleans())
def test_nesting_depth_is_the_values_nesting(value, ascii_only):
  text = json.dumps(value, ensure_ascii=ascii_only).encode()
  assert wire.nesting_depth(text) == depth(value)
  for limit in (0, depth(value) - 1, depth(value)):
    assert wire.deeper_than(text, limit) == (depth(value) > limit)


@pytest.mark.parametrize("text, expected", [
    (b"", 0), (b'"', 0), (b'"\\', 0), (b'"[[[', 0), (b'["a\\"[", [[]]]', 3), (b"]]]", 0),
    (b"[" * 5000, 5000), (b'"\\"' * 1000 + b"[", 0)], ids=[
        "empty", "quote", "quote_backslash", "unclosed_string", "escaped_quote", "closing",
        "unclosed_5000", "escaped_quotes_unclosed"])
def test_nesting_depth_of_broken_lines(text, expected):
  """Unclosed strings and brackets (a hostile line): a count, never an exception."""
  assert wire.nesting_depth(text) == expected


def reply(request_id, ok, payload, **extra):
  key = "result" if ok else "error"
  return {"id": request_id, "ok": ok, key: payload, "stdout": "", **extra}


@settings(max_examples=200)
@given(st.integers(1, 10**9), json_values.filter(lambda v: depth(v) <= wire.MAX_DEPTH))
def test_a_well_formed_reply_comes_back_as_sent(request_id, value):
  line = json.dumps(reply(request_id, True, value)).encode()
  assert wire.check_reply(line, request_id, len(line)) == reply(request_id, True, value)
  line = json.dumps(reply(request_id, False, "ValueError: x")).encode()
  assert wire.check_reply(line, request_id, len(line))["error"] == "ValueError: x"


@pytest.mark.parametrize("line, why", [
    (json.dumps(reply(7, True, 1)).encode() + b" ", "more than"),
    (b'{"id": 7, "ok": true, "stdout": "", "result": ' + b"[" * 70 + b"]" * 70 + b"}",
     "nested more than"),
    (b"[" * 100_000 + b"]" * 100_000, "nested more than"),
    (b'{"id": 7, "ok": true, "result": NaN, "stdout": ""}', "not JSON"),
    (b'\xff\xfe', "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (json.dumps(reply(8, True, 1)).encode(), "another request"),
    (json.dumps(reply(True, True, 1)).encode(), "another request"),
    (json.dumps({"id": 7, "ok": True, "stdout": ""}).encode(), "keys are not"),
    (json.dumps(reply(7, True, 1, extra=1)).encode(), "keys are not"),
    (json.dumps(reply(7, 1, 1)).encode(), "keys are not"),
    (json.dumps(reply(7, False, {"a": 1})).encode(), "not a string"),
    (json.dumps({**reply(7, True, 1), "stdout": 3}).encode(), "not a string"),
])
def test_anything_but_the_reply_in_flight_is_refused(line, why):
  limit = len(json.dumps(reply(7, True, 1)).encode()) if why == "more than" else 10**7
  with pytest.raises(wire.ReplyError, match=why):
    wire.check_reply(line, 7, limit)


def test_an_id_must_match_in_type_too():
  with pytest.raises(wire.ReplyError, match="another request"):  # True == 1 in Python
    wire.check_reply(json.dumps(reply(True, True, 1)).encode(), 1, 10**6)
  with pytest.raises(wire.ReplyError, match="another request"):
    wire.check_reply(json.dumps(reply(1.0, True, 1)).encode(), 1, 10**6)


def test_the_start_up_line_carries_booleans_only():
  good = reply(None, True, "ready", enforced={"seccomp": True})
  assert wire.check_reply(json.dumps(good).encode(), None, 10**6) == good
  with pytest.raises(wire.ReplyError, match="not booleans"):
    bad = reply(None, True, "ready", enforced={"seccomp": "yes"})
    wire.check_reply(json.dumps(bad).encode(), None, 10**6)
  with pytest.raises(wire.ReplyError, match="keys are not"):  # only the start-up line has it
    wire.check_reply(json.dumps(reply(3, True, 1, enforced={})).encode(), 3, 10**6)


@settings(max_examples=300)
@given(st.text(max_size=200), st.integers(1, 120))
def test_held_to_keeps_the_start_within_the_limit(text, limit):
  held = wire.held_to(text, limit)
  assert len(held) <= limit
  if len(text) <= limit:
    assert held == text
  else:
    note = f" ... [{len(text)} characters, cut to {limit}]"
    assert held == (text[:limit - len(note)] + note if len(note) < limit else text[:limit])


# -- removing trees ---------------------------------------------------------------------

entries = st.recursive(st.sampled_from(["file", "link", "dangling"]),
                       lambda c: st.dictionaries(st.sampled_from("abcd"), c, max_size=3),
                       max_leaves=20)


def build(path, tree, outside):
  if tree == "file":
    with open(path, "w") as f:
      f.write("x")
  elif tree == "link":
    os.symlink(outside, path)
  elif tree == "dangling":
    os.symlink(path + "-missing", path)
  else:
    os.mkdir(path)
    for name, sub in tree.items():
      build(os.path.join(path, name), sub, outside)
    if len(tree) == 2:
      os.chmod(path, 0o500)  # read-only folders, as tool code may leave them


@settings(max_examples=60, deadline=None)
@given(entries)
def test_remove_tree_removes_everything_and_follows_no_link(tree):
  base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
  with tempfile.TemporaryDirectory(dir=base) as tmp:
    outside = os.path.join(tmp, "outside")
    os.mkdir(outside)
    with open(os.path.join(outside, "keep"), "w") as f:
      f.write("kept")
    root = os.path.join(tmp, "tree")
    build(root, tree, outside)
    files.remove_tree(root)
    assert not os.path.lexists(root)
    assert os.listdir(outside) == ["keep"]
  files.remove_tree(os.path.join(tempfile.gettempdir(), "no-such-folder-tirjax"))  # no error
