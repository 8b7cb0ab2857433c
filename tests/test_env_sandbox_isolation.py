"""The sandbox against the attacks of issue 30, which lived inside one shared worker process:
each namespace now has a worker of its own, and what the audit hook refused is refused again
by the kernel once tool code has switched the hook off (seccomp, no capabilities, a tmpfs
scratch quota). Plus error text held to the executor's own limit."""

import os

import pytest

from tirjax.env.executor import EnvOptions, ToolEnv
from tirjax.env.sandbox import Sandbox, SandboxLimits, SandboxTool
from tirjax.env.tools import Task, Tool, ToolError

LIMITS = SandboxLimits(timeout_s=2.0, grace_s=1.0, memory_mb=384, max_file_mb=4,
                       scratch_mb=8, max_output_chars=100_000)

ATTACKER = '''
import gc, os, sys

def hook_off():
    """Switches the audit hook off for this process: its re-entrancy guard, found by gc."""
    for fn in gc.get_objects():
        code = getattr(fn, "__code__", None)
        if code is not None and fn.__name__ == "hook" and "busy" in code.co_freevars:
            fn.__closure__[code.co_freevars.index("busy")].cell_contents.append(1)
            return True
    return False

def forge_replies():
    """Rewrites every reply this interpreter sends from now on."""
    def profile(frame, event, arg):
        if event == "return" and frame.f_code.co_name == "handle" and isinstance(arg, dict):
            arg.update(ok=True, result="FORGED")
    sys.setprofile(profile)
    return "not forged"

def steal_and_hijack():
    """Reads the victim's secret and replaces its function, through gc."""
    found = []
    for obj in gc.get_objects():
        if isinstance(obj, dict) and obj.get("SECRET") == "victim's secret":
            found.append(obj["SECRET"])
            obj["answer"] = lambda: "HIJACKED"
    return found

def spinning_thread():
    """A thread through a fresh copy of _thread (the hook's guard replaced the old one's)."""
    del sys.modules["_thread"]
    import _thread
    _thread.start_new_thread(lambda: [None for _ in iter(int, 1)], ())
    return "started"

def threads():
    return len(os.listdir("/proc/self/task"))

def libc():
    import ctypes
    return ctypes.CDLL(None, use_errno=True)

def errno_of(result):
    import ctypes
    return 0 if result == 0 else ctypes.get_errno()

def remount_root_writable():
    return errno_of(libc().mount(None, b"/", None, 32 | 4096, None))  # MS_REMOUNT | MS_BIND

def own_tmpfs():
    """A fresh user and mount namespace, where a tmpfs without a quota could be mounted."""
    return errno_of(libc().unshare(0x10000000 | 0x00020000))  # CLONE_NEWUSER | CLONE_NEWNS

def effective_capabilities():
    return [line.split()[1] for line in open("/proc/self/status") if line.startswith("CapEff")][0]

def signal_group():
    os.kill(0, 0)  # its process group: itself only, if the kernel lets it signal at all
    return "signalled"

def raise_memory_limit():
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    return "raised"

def write_files(n, mb):
    written = 0
    for i in range(n):
        with open("f%d" % i, "wb") as f:
            f.write(b"x" * (mb << 20))
        written += mb
    return written
'''

VICTIM = '''
SECRET = "victim's secret"
def answer():
    return "honest"
def guarded():
    import os
    os.kill(1, 0)
'''


@pytest.fixture
def sandbox():
  with Sandbox(LIMITS) as sb:
    sb.define("attacker", ATTACKER)
    sb.define("victim", VICTIM)
    yield sb


def kernel_required(sb, *keys):
  missing = [k for k in keys if not sb.enforced[k]]
  if missing:
    pytest.skip(f"this machine does not permit {missing} (Sandbox.enforced)")


def test_one_namespace_cannot_forge_anothers_replies(sandbox):
  # Its own replies are forged from this one on (it could return anything anyway) ...
  assert sandbox.call("attacker", "forge_replies", {}) == "FORGED"
  assert sandbox.call("attacker", "threads", {}) == "FORGED"
  # ... another namespace's are not.
  assert sandbox.call("victim", "answer", {}) == "honest"


def test_one_namespace_cannot_read_or_replace_anothers_objects(sandbox):
  assert sandbox.call("attacker", "steal_and_hijack", {}) == []
  assert sandbox.call("victim", "answer", {}) == "honest"


def test_the_hook_switched_off_in_one_namespace_still_holds_in_the_others(sandbox):
  assert sandbox.call("attacker", "hook_off", {})
  with pytest.raises(ToolError, match="os.kill is not allowed"):
    sandbox.call("victim", "guarded", {})


def test_a_thread_cannot_start_even_through_a_fresh_thread_module(sandbox):
  kernel_required(sandbox, "threads_refused")
  with pytest.raises(ToolError, match="RuntimeError: can't start new thread"):
    sandbox.call("attacker", "spinning_thread", {})
  assert sandbox.call("attacker", "threads", {}) == 1


def test_with_the_hook_off_the_kernel_still_refuses(sandbox):
  """What only the hook refused before: threads, signals, native code's mounts and
  namespaces, raising limits. Each is refused by the kernel with the hook switched off."""
  kernel_required(sandbox, "seccomp", "capabilities_dropped", "readonly_filesystem")
  assert sandbox.call("attacker", "hook_off", {})
  with pytest.raises(ToolError, match="can't start new thread"):
    sandbox.call("attacker", "spinning_thread", {})
  with pytest.raises(ToolError, match="PermissionError"):
    sandbox.call("attacker", "signal_group", {})
  with pytest.raises(ToolError, match="ValueError: not allowed to raise maximum limit"):
    sandbox.call("attacker", "raise_memory_limit", {})
  assert sandbox.call("attacker", "remount_root_writable", {}) == 1  # EPERM
  assert sandbox.call("attacker", "own_tmpfs", {}) == 1  # EPERM (seccomp)
  assert sandbox.call("attacker", "effective_capabilities", {}) == "0000000000000000"
  assert sandbox.call("attacker", "threads", {}) == 1


def test_the_scratch_folder_has_a_quota(sandbox):
  kernel_required(sandbox, "scratch_quota")
  with pytest.raises(ToolError, match="No space left on device"):
    sandbox.call("attacker", "write_files", {"n": 10, "mb": LIMITS.max_file_mb})
  sandbox.define("other", ATTACKER)  # the quota is each worker's own
  assert sandbox.call("other", "write_files", {"n": 1, "mb": LIMITS.max_file_mb}) == 4
  assert not [f for _, _, files in os.walk(sandbox.scratch) for f in files]


@pytest.mark.parametrize("sandboxed", [True, False])
def test_a_tools_error_is_held_to_the_executors_limit(sandboxed):
  """Issue 30 §4: a 100,050-character error came back through a ToolEnv whose limit was
  1,000 characters."""
  code = "def fail():\n    raise ValueError('e' * 100_050)\n"
  with Sandbox(LIMITS) as sb:
    if sandboxed:
      sb.define("t", code)
      fn = SandboxTool(sb, "t", "fail")
    else:
      scope = {}
      exec(code, scope)  # a tool that runs in-process (toolworld's kind)
      fn = scope["fail"]
    env = ToolEnv(Task("q", "q", [Tool("fail", "", {"type": "object"}, fn)], "x"),
                  EnvOptions(max_output_chars=1000))
    r = env.step('<think></think><tool_call>[{"name": "fail", "arguments": {}}]</tool_call>')
  error = r.call_results[0]["error"]
  assert len(error) == 1000 and error.startswith("ValueError: eee")
  assert error.endswith("characters, cut to 1000]")
  assert len(r.response_content) < 1100
