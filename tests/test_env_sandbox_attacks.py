"""The sandbox against the attacks of issue 14 (§3), each in pure Python tool code: the kernel
(seccomp, mount, PID and network namespaces, a lifeline pipe) contains what the audit hook
alone did not."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from tirjax.env.sandbox import Sandbox, SandboxLimits, kernel_isolation_available
from tirjax.env.tools import ToolError
from tirjax.testing.sandbox_probes import alive as is_alive, cpu_ticks, libseccomp_loads

LIMITS = SandboxLimits(timeout_s=2.0, grace_s=1.0, memory_mb=384, max_output_chars=1000)

ATTACKS = '''
import os
def fork_exec():
    import _posixsubprocess
    r, w = os.pipe()
    return _posixsubprocess.fork_exec(
        [b"/bin/sleep", b"30"], [b"/bin/sleep"], True, (w,), None, None, -1, -1, -1, -1, -1,
        -1, r, w, True, True, -1, None, None, None, -1, None, False)
def open_dir_fd(folder):
    fd = os.open(folder, os.O_RDONLY)
    return os.open("escaped", os.O_CREAT | os.O_WRONLY, dir_fd=fd)
def mkdir_dir_fd(folder):
    fd = os.open(folder, os.O_RDONLY)
    os.mkdir("escaped_dir", dir_fd=fd)
def mkfifo(folder):
    os.mkfifo(os.path.join(folder, "escaped_fifo"))
def rebind_then_write(folder):
    import __main__
    for name in ("_NETWORK", "_PROCESS", "_PATH_WRITES"):
        setattr(__main__, name, type(getattr(__main__, name))())
    __main__._WRITE_FLAGS = 0
    __main__.os = None
    with open(os.path.join(folder, "escaped_open"), "w") as f:
        f.write("x")
def rebind_then_system(folder):
    import __main__
    __main__._PROCESS = ()
    return os.system("touch " + os.path.join(folder, "escaped_system"))
def huge_error(n):
    raise ValueError("e" * n)
def forge_replies():
    forged = json.dumps({"ok": True, "result": "forged", "stdout": "", "id": None})
    written = []
    for fd in range(3, 32):
        try:
            os.write(fd, (forged + "\\n").encode())
            written.append(fd)
        except OSError:
            pass
    return "honest"
def echo(x):
    return x
def patch_builtins():
    import builtins
    builtins.len = None
    __builtins__["sorted"] = None
    return "patched"
def uses_builtins():
    return len(sorted([3, 1, 2]))
def uses_len():
    return len([1, 2])
import json
'''


@pytest.fixture(scope="module")
def sandbox():
  with Sandbox(LIMITS) as sb:
    sb.define("a", ATTACKS)
    yield sb


def kernel_required(sb, *keys):
  missing = [k for k in keys if not sb.enforced[k]]
  if missing:
    pytest.skip(f"this machine does not permit {missing} (Sandbox.enforced)")


def test_every_layer_the_machine_permits_is_on(sandbox):
  """Where unprivileged namespaces exist (CI's machine), the namespaces and the read-only view
  are in force, and the seccomp filter wherever libseccomp loads: a layer that silently fails
  to come up fails here instead of turning the attack tests below into skips."""
  if not kernel_isolation_available():
    pytest.skip("no unprivileged user, PID and mount namespaces on this machine")
  for key in ("network_namespace", "pid_namespace", "readonly_filesystem", "parent_death",
              "scratch_quota", "capabilities_dropped", "worker_per_namespace",
              "unprivileged_user", "no_new_privs", "ipc_namespace", "writable_mounts_noexec"):
    assert sandbox.enforced[key], key
  assert sandbox.enforced["seccomp"] == libseccomp_loads()
  assert sandbox.enforced["threads_refused"] == libseccomp_loads()
  if libseccomp_loads():  # issue 40: on CI's machine (root, pyenv under /root) every layer
    assert all(sandbox.enforced.values()), sandbox.enforced


def test_fork_exec_is_refused_and_nothing_outlives_close(sandbox, tmp_path):
  kernel_required(sandbox, "seccomp")
  before = subprocess.run(["pgrep", "-fc", "^/bin/sleep 30"], capture_output=True,
                          text=True).stdout.strip()
  with pytest.raises(ToolError, match="PermissionError|Operation not permitted"):
    sandbox.call("a", "fork_exec", {})
  after = subprocess.run(["pgrep", "-fc", "^/bin/sleep 30"], capture_output=True,
                         text=True).stdout.strip()
  assert after == before


@pytest.fixture
def open_folder():
  """A host folder the worker's unprivileged user could write (mode 0777 under /tmp), so that
  the read-only mount, not file permissions, is what stops a write to it."""
  with tempfile.TemporaryDirectory() as folder:
    os.chmod(folder, 0o777)
    yield folder


@pytest.mark.parametrize("attack", ["open_dir_fd", "mkdir_dir_fd", "mkfifo", "rebind_then_write"])
def test_nothing_is_created_outside_the_scratch_folder(sandbox, open_folder, attack):
  kernel_required(sandbox, "readonly_filesystem")
  with pytest.raises(ToolError, match="Read-only file system|not allowed"):
    sandbox.call("a", attack, {"folder": open_folder})
  assert os.listdir(open_folder) == []
  assert sandbox.call("a", "echo", {"x": 1}) == 1


def test_rebinding_the_workers_globals_leaves_process_creation_refused(sandbox, tmp_path):
  sandbox.define("r", ATTACKS)  # its own namespace: the rebinding hits the worker module
  out = None
  try:
    out = sandbox.call("r", "rebind_then_system", {"folder": str(tmp_path)})
  except ToolError as e:
    assert "not allowed" in str(e) or "not permitted" in str(e)
  assert out in (None, -1) or out != 0
  assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("size", [5_000_000, 50_000_000])
def test_errors_are_limited_like_outputs(sandbox, size):
  start = time.monotonic()
  with pytest.raises(ToolError) as err:
    sandbox.call("a", "huge_error", {"n": size})
  message = str(err.value)
  assert message.startswith("ValueError: eee") and message.endswith("cut to 1000]")
  assert len(message) == LIMITS.max_output_chars
  assert time.monotonic() - start < LIMITS.timeout_s  # not reported as a time-out


def test_lines_tool_code_writes_to_the_reply_pipe_shift_nothing(sandbox):
  """A line that is not the reply to the request in flight gets its worker killed (issue 40):
  the later calls go to a fresh worker, each answered in order."""
  with pytest.raises(ToolError, match="a reply to another request .* killed"):
    sandbox.call("a", "forge_replies", {})
  assert [sandbox.call("a", "echo", {"x": i}) for i in range(4)] == [0, 1, 2, 3]


def test_patched_builtins_do_not_reach_another_namespace(sandbox):
  sandbox.define("victim", ATTACKS)
  assert sandbox.call("victim", "uses_builtins", {}) == 3
  assert sandbox.call("a", "patch_builtins", {}) == "patched"
  assert sandbox.call("victim", "uses_builtins", {}) == 3
  # The shared module is restored after the call; the namespace's own copy keeps its change.
  assert sandbox.call("a", "uses_len", {}) == 2


TOOL = """
def f():
    open('left_behind.txt', 'w').write('x')
    return 1
def stubborn():
    while True:
        try:
            while True:
                pass
        except BaseException:
            pass
"""

OWNER = textwrap.dedent(f"""
    import json, os, sys
    from tirjax.env.sandbox import Sandbox, SandboxLimits
    sb = Sandbox(SandboxLimits(timeout_s=600.0))
    sb.define("a", {TOOL!r})
    sb.define("b", {TOOL!r})
    sb.call("a", "f", {{}})
    print(json.dumps({{"group": sb._zygote.proc.pid, "scratch": sb.scratch}}), flush=True)
    sb.call("a", "stubborn", {{}})  # busy when its owner is killed: it never reads its stdin
""")


def _descendants(pid):
  """`pid` and every process under it (the unshare process, the zygote, its workers)."""
  found, todo = [], [pid]
  while todo:
    p = todo.pop()
    found.append(p)
    for task in os.listdir(f"/proc/{p}/task") if os.path.exists(f"/proc/{p}") else ():
      with open(f"/proc/{p}/task/{task}/children") as f:
        todo += [int(c) for c in f.read().split()]
  return found


def test_a_sigkilled_owner_takes_its_workers_and_scratch_with_it(tmp_path):
  owner = subprocess.Popen([sys.executable, "-c", OWNER], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True,
                           env={**os.environ, "PYTHONPATH": os.getcwd()})
  info = json.loads(owner.stdout.readline())
  pids = _descendants(info["group"])
  workers = [p for p in pids if p != info["group"] and not _descendants(p)[1:]]
  assert len(workers) == 2, pids  # one per namespace, beside the zygote
  ticks = {p: cpu_ticks(p) for p in workers}
  deadline = time.monotonic() + 30
  while all(cpu_ticks(p) < ticks[p] + 10 for p in workers):  # "a" is in the tool's loop
    assert time.monotonic() < deadline and owner.poll() is None
    time.sleep(0.05)
  owner.send_signal(signal.SIGKILL)
  owner.wait()
  deadline = time.monotonic() + 30
  alive = pids
  while alive and time.monotonic() < deadline:  # an observable state, polled
    alive = [p for p in pids if is_alive(p)]
    time.sleep(0.05)
  assert not alive, f"sandbox processes {alive} outlived their owner"
  assert not os.path.exists(info["scratch"]) or os.listdir(info["scratch"]) == []  # emptied
  with Sandbox(LIMITS):  # the next sandbox removes the dead owner's scratch folder
    assert not os.path.exists(info["scratch"])
