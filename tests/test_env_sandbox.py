"""Sandbox (spec §6): runaway, hostile or crashing tool code is stopped or refused within its
limit, and the next call works."""

import dataclasses
import os
import time

import pytest

from tirjax.env.executor import ToolEnvOptions, ToolEnv
from tirjax.env.sandbox import Sandbox, SandboxLimits, SandboxTool, network_namespace_available
from tirjax.env.tools import Task, Tool, ToolError

CODE = '''
import os, socket, time
print("defined!")
state = []
def ok(x):
    print("called")
    return {"x": x, "n": len(state)}
def push(v):
    state.append(v)
    return len(state)
def loop():
    while True:
        pass
def stubborn_loop():
    while True:
        try:
            time.sleep(10)
        except BaseException:
            pass
def memory_bomb():
    return bytearray(10 ** 11)
def slow_memory_bomb():
    chunks = []
    while True:
        chunks.append(bytearray(10 ** 7))
def system():
    return os.system("touch /tmp/sandbox_escaped")
def connect():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.connect(("127.0.0.1", 9))
    return "connected"
def write_root():
    with open("/sandbox_escape.txt", "w") as f:
        f.write("x")
    return "written"
def write_scratch():
    with open("note.txt", "w") as f:
        f.write("kept")
    return open("note.txt").read()
def remove_outside():
    os.remove("/etc/hostname")
def fork():
    return os.fork()
def thread():
    import threading
    threading.Thread(target=print).start()
def die():
    os._exit(1)
def big_output():
    return "y" * 5000
'''
LIMITS = SandboxLimits(timeout_s=0.5, grace_s=0.5, memory_mb=384, max_output_chars=1000)


@pytest.fixture(scope="module")
def sandbox():
  with Sandbox(LIMITS) as sb:
    assert sb.define("t", CODE) == "defined!\n"
    yield sb


def call(sb, fn, **kw):
  t0 = time.monotonic()
  try:
    out = sb.call("t", fn, kw)
  except ToolError as e:
    out = ToolError(str(e))
  return out, time.monotonic() - t0


def assert_next_call_works(sb):
  out, _ = call(sb, "ok", x=1)
  assert out["x"] == 1


# The wall-clock guarantee: a call returns by timeout_s + grace_s (+ slack for a loaded host).
DEADLINE = LIMITS.timeout_s + LIMITS.grace_s + 2.0


@pytest.mark.parametrize("fn, message", [
    ("loop", "timed out after 0.5 s"),
    ("stubborn_loop", "timed out after 0.5 s (the tool process was killed)"),
    ("memory_bomb", "memory limit exceeded (384 MiB)"),
    ("slow_memory_bomb", ""),
    ("system", "os.system is not allowed"),
    ("connect", "network access is not allowed"),
    ("write_root", "writing '/sandbox_escape.txt' is not allowed"),
    ("remove_outside", "os.remove on '/etc/hostname' is not allowed"),
    ("fork", "os.fork is not allowed"),
    ("thread", "starting threads is not allowed"),
    ("die", "the tool process died"),
    ("big_output", "tool output too large: 5002 characters (limit 1000)"),
])
def test_contained_within_limit_and_next_call_works(sandbox, fn, message):
  out, took = call(sandbox, fn)
  assert isinstance(out, ToolError), out
  assert message in str(out)
  if fn == "slow_memory_bomb":  # whichever limit it reaches first
    assert "memory limit exceeded" in str(out) or "timed out" in str(out)
  assert took < DEADLINE, took
  assert_next_call_works(sandbox)
  assert not os.path.exists("/sandbox_escape.txt")
  assert not os.path.exists("/tmp/sandbox_escaped")


def test_network_namespace_has_only_loopback(sandbox):
  sandbox.define("net", "def interfaces():\n"
                 "    return sorted(l.split(':')[0].strip() for l in open('/proc/net/dev')"
                 ".readlines()[2:])")
  interfaces = sandbox.call("net", "interfaces", {})
  assert (interfaces == ["lo"]) == sandbox.enforced["network_namespace"]
  assert sandbox.enforced["network_namespace"] == network_namespace_available()


def test_each_namespace_writes_its_own_scratch_folder(sandbox):
  out, _ = call(sandbox, "write_scratch")
  assert out == "kept"
  assert sandbox.call("t", "ok", {"x": 0}) and call(sandbox, "write_scratch")[0] == "kept"
  sandbox.define("other", "import os\ndef ls():\n    return os.listdir('.')")
  assert sandbox.call("other", "ls", {}) == []  # another worker, another folder
  if sandbox.enforced["scratch_quota"]:  # a tmpfs in the worker's mount namespace
    assert not [f for _, _, files in os.walk(sandbox.scratch) for f in files]


def test_least_recently_used_workers_make_room_and_their_namespaces_come_back():
  with Sandbox(dataclasses.replace(LIMITS, max_workers=2)) as sb:
    sb.define("a", CODE, stateful=True)
    assert [sb.call("a", "push", {"v": i}) for i in range(2)] == [1, 2]
    sb.define("b", CODE)
    assert sb.call("a", "ok", {"x": 0})["n"] == 2  # "a" is now the most recently used
    sb.define("c", CODE)  # closes "b"
    assert sb.live_workers == 2
    assert sb.call("b", "ok", {"x": 1})["x"] == 1  # defined again; closes "a"
    assert sb.call("a", "ok", {"x": 0})["n"] == 2  # defined again, its calls replayed
    assert sb.live_workers == 2 and sb.restarts == 0


def test_stateful_namespace_survives_a_restart():
  with Sandbox(LIMITS) as sb:
    sb.define("s", CODE, stateful=True)
    assert [sb.call("s", "push", {"v": i}) for i in range(3)] == [1, 2, 3]
    with pytest.raises(ToolError, match="killed"):
      sb.call("s", "stubborn_loop", {})
    assert sb.restarts == 1
    assert sb.call("s", "ok", {"x": 0})["n"] == 3  # replayed after the restart
    sb.drop("s")
    with pytest.raises(ToolError, match="never defined"):
      sb.call("s", "ok", {"x": 0})


def test_definition_failures_are_reported_on_call():
  with Sandbox(LIMITS) as sb:
    with pytest.raises(ToolError, match="failed to load: ZeroDivisionError"):
      sb.define("bad", "x = 1 / 0")
    with pytest.raises(ToolError, match="failed to load: ZeroDivisionError"):
      sb.call("bad", "x", {})
    with pytest.raises(ToolError, match="NameError: 'nope' is not defined"):
      sb.define("good", "y = 1")
      sb.call("good", "nope", {})


def test_episode_continues_after_a_runaway_tool(sandbox):
  tools = [Tool(n, "", {"type": "object"}, SandboxTool(sandbox, "t", n)) for n in ("loop", "ok")]
  env = ToolEnv(Task("s", "q", tools + [Tool("ok2", "", {"type": "object", "properties": {
      "x": {"type": "integer"}}}, SandboxTool(sandbox, "t", "ok"))], "x"), ToolEnvOptions())
  r = env.step('<think></think><tool_call>[{"name": "loop", "arguments": {}}, '
               '{"name": "ok2", "arguments": {"x": 7}}]</tool_call>')
  assert r.call_results[0] == {"name": "loop", "error": "timed out after 0.5 s"}
  assert r.call_results[1]["result"]["x"] == 7
  assert r.checks_passed == 4 and not r.done


def test_without_namespaces_each_namespace_still_has_a_process_and_the_gaps_are_reported():
  """`isolate_network=False` (as on a machine without user namespaces): no namespaces, no
  read-only view, no scratch quota, and `enforced` says so; time-outs and separate workers
  still hold."""
  with Sandbox(dataclasses.replace(LIMITS, isolate_network=False)) as sb:
    sb.define("a", CODE)
    sb.define("b", CODE, stateful=True)
    assert sb.call("a", "ok", {"x": 2})["x"] == 2 and sb.call("b", "push", {"v": 1}) == 1
    for key in ("network_namespace", "pid_namespace", "readonly_filesystem", "scratch_quota"):
      assert not sb.enforced[key], key
    assert sb.enforced["worker_per_namespace"] and sb.live_workers == 2
    with pytest.raises(ToolError, match="killed"):
      sb.call("a", "stubborn_loop", {})
    assert sb.call("b", "push", {"v": 2}) == 2  # another worker: untouched
    assert sb.call("a", "ok", {"x": 3})["x"] == 3


def test_limits_are_validated_and_enforcement_reported():
  with pytest.raises(ValueError, match="memory_mb"):
    SandboxLimits(memory_mb=16)
  with pytest.raises(ValueError, match="timeout_s"):
    SandboxLimits(timeout_s=0)
  for name in ("scratch_mb", "max_workers", "max_output_chars", "max_open_files"):
    with pytest.raises(ValueError, match=name):
      SandboxLimits(**{name: 0})
  with pytest.raises(ValueError, match="call_budget_s: must be >= 2.0 .*one request's time"):
    SandboxLimits(timeout_s=1.0, grace_s=1.0, call_budget_s=1.5)
  assert SandboxLimits(timeout_s=1.0, grace_s=0.5).budget_s == 3.0
  with Sandbox(LIMITS) as sb:
    assert sb.enforced["audit_hook"] and sb.enforced["memory_limit"]
    assert isinstance(sb.enforced["network_namespace"], bool)
