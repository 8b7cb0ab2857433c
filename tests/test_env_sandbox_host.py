"""The sandbox against the attacks of issue 40, one test per attack class, on a machine where
the owner is root and the interpreter lives in root's private home (CI's). Each test names the
layer that stops its attack; most first switch the audit hook off, so that the kernel's or the
owner's layer is what holds. The verdict attacks (class 9) are in test_bfcl_multi_turn.py and
test_env_parser.py."""

import dataclasses
import os
import pathlib
import signal
import tempfile
import threading

import pytest

from tirjax.env import _sandbox_files as files
from tirjax.env.sandbox import Sandbox, SandboxLimits, kernel_isolation_available
from tirjax.env.tools import ToolError
from tirjax.testing.sandbox_probes import (HOOK_OFF, alive, libseccomp_loads, syscall_numbers,
                                           worker_pid)

LIMITS = SandboxLimits(timeout_s=1.0, grace_s=0.5, memory_mb=384, max_file_mb=4,
                       scratch_mb=32, max_output_chars=100_000)
SECRET = "TIRJAX_TEST_API_KEY"

ATTACKER = HOOK_OFF + r'''
import fcntl, json, os, shutil, stat, sys

def _pipe(access):
    """This worker's request pipe (its read end) or reply pipe (its write end)."""
    for fd in range(3, 64):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode) and (
                    fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE) == access:
                return fd
        except OSError:
            pass

def _request_id():
    frame = sys._getframe()
    while frame.f_code.co_name != "handle":
        frame = frame.f_back
    return frame.f_locals["req"]["id"]

def whoami():
    st = os.stat(".")
    return [os.getuid(), os.geteuid(), os.getgid(), os.getegid(), os.getgroups(), st.st_uid]

def setuid_copy():
    """Issue 40 §1: a set-uid copy of /usr/bin/id where others can run it."""
    made = []
    for folder in ("..", "."):
        fd = os.open(folder, os.O_RDONLY)
        try:
            out = os.open("id", os.O_CREAT | os.O_WRONLY, 0o755, dir_fd=fd)
            with open("/usr/bin/id", "rb") as src:
                os.write(out, src.read())
            os.fchmod(out, 0o4755)
            os.close(out)
            made.append(folder)
        except OSError as e:
            made.append(f"{folder}: {e.strerror}")
    mode = os.stat("id").st_mode
    return {"made": made, "setuid": bool(mode & stat.S_ISUID),
            "mount_nosuid": bool(os.statvfs(".").f_flag & os.ST_NOSUID),
            "owner_uid": os.stat("id").st_uid}

def writable_mounts():
    """Every mount point a path reaches whose mount is writable, with its flags."""
    out = {}
    for line in open("/proc/self/mountinfo"):
        point = line.split()[4].encode().decode("unicode_escape")
        try:
            flags = os.statvfs(point).f_flag
        except OSError:
            continue
        if not flags & os.ST_RDONLY:
            out[point] = [bool(flags & f) for f in (os.ST_NOSUID, os.ST_NODEV, os.ST_NOEXEC)]
    return {"mounts": out, "cwd": os.getcwd()}

def write_outside(folder):
    """Issue 40 §2: every route to a folder outside the scratch tmpfs."""
    here = os.open(".", os.O_RDONLY)
    up = os.open("..", os.O_RDONLY)
    routes = {"dotdot": "../f", "dir_fd": ("f", up), "proc_cwd": "/proc/self/cwd/../f",
              "proc_fd": f"/proc/self/fd/{up}/f", "parent": os.path.dirname(os.getcwd()) + "/f",
              "host_folder": os.path.join(folder, "f"), "tmp": "/tmp/tirjax-escape",
              "dev_shm": "/dev/shm/tirjax-escape", "root_of": "/proc/self/root" + folder + "/g"}
    out = {}
    for name, route in routes.items():
        path, fd = route if isinstance(route, tuple) else (route, None)
        try:
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
            out[name] = "written"
        except OSError as e:
            out[name] = e.strerror
    with open("big", "wb") as f:  # in the tmpfs: counted there, never on the host's disk
        f.write(b"x" * (3 << 20))
    os.close(here)
    return out

def squat(names):
    """Issue 40 §3: folders made ahead of the ones the owner will make."""
    out = []
    for name in names:
        try:
            os.mkdir(os.path.join("..", name))
            out.append("made")
        except OSError as e:
            out.append(e.strerror)
    return out

def deep_tree(depth):
    """Issue 40 §4: a folder chain deeper than any recursive walk goes."""
    fd = os.open(".", os.O_RDONLY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(fd)
    return depth

def reopen_request_pipe():
    """Issue 40 §5: its own request pipe, reopened for writing through /proc/self/fd (to fill
    it, forge its reply and never read again)."""
    return os.open(f"/proc/self/fd/{_pipe(os.O_RDONLY)}", os.O_WRONLY | os.O_NONBLOCK)

def stall_on_resume():
    """Issue 40 §5: a SIGCONT handler that never returns."""
    import signal
    def spin(signum, frame):
        while True:
            try:
                while True:
                    pass
            except BaseException:
                pass
    signal.signal(signal.SIGCONT, spin)
    return "armed"

def echo(x):
    return len(x) if isinstance(x, str) else x

def raw_reply(kind):
    """Issue 40 §6: a line with the right id that the owner must not trust."""
    rid = _request_id()
    lines = {"nested": '{"id": %d, "ok": true, "stdout": "", "result": %s}' % (
                 rid, "[" * 100_000 + "]" * 100_000),
             "deep": '{"id": %d, "ok": true, "stdout": "", "result": %s}' % (
                 rid, "[" * 500 + "]" * 500),
             "no_result": json.dumps({"id": rid, "ok": True, "stdout": ""}),
             "not_a_string": json.dumps({"id": rid, "ok": False, "error": {"x": 1},
                                         "stdout": ""})}
    os.write(_pipe(os.O_WRONLY), (lines[kind] + "\n").encode())
    return "honest"

def syscall_errno(nr, args):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    result = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return 0 if result >= 0 else ctypes.get_errno()

def shared_mapping(mb):
    import mmap
    return len(mmap.mmap(-1, mb << 20, flags=mmap.MAP_SHARED))

def rewrite_reply(n):
    """Issue 40 §8: a profile function that rewrites this worker's reply after its check."""
    def profile(frame, event, arg):
        if event == "return" and frame.f_code.co_name == "handle" and isinstance(arg, dict):
            arg.update(ok=True, result="y" * n)
    sys.setprofile(profile)
    return "small"

class _Sneaky(dict):
    calls = [0]
    def items(self):
        self.calls[0] += 1
        return [("a", "z" * (10 if self.calls[0] == 1 else self["n"]))]

def sneaky_result(n):
    """Issue 40 §8: small while the worker measures it, large on the wire."""
    return _Sneaky(n=n)

def environment():
    text = []
    for path in ("/proc/self/environ", "/proc/1/environ"):
        try:
            text.append(open(path, "rb").read().decode("latin-1"))
        except OSError as e:  # a non-dumpable process's own entries belong to root
            text.append(e.strerror)
    return {"env": dict(os.environ), "proc": text}
'''


@pytest.fixture(scope="module")
def sandbox():
  """One sandbox for the module, started while the owner's environment holds a secret."""
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv(SECRET, "sk-do-not-leak")
    sb = Sandbox(LIMITS)
    sb.define("a", ATTACKER)
  with sb:
    yield sb


@pytest.fixture(autouse=True)
def contained(sandbox):
  if not kernel_isolation_available():
    pytest.skip("no user, PID and mount namespaces on this machine")
  if not libseccomp_loads():
    pytest.skip("libseccomp is not installed on this machine")


def fresh(sandbox, ns):
  """Namespace `ns` in a worker of its own, with the audit hook off."""
  sandbox.define(ns, ATTACKER)
  assert sandbox.call(ns, "hook_off", {})
  return ns


def returns(unblock, fn, *args):
  """fn(*args) run in a thread: its outcome, or "blocked" if it has not returned after a
  minute (the owner must return by the call's deadline, 1.5 s here); then `unblock()` is
  called, so that a failing test does not hang the session too."""
  out = []

  def run():
    try:
      out.append(fn(*args))
    except BaseException as e:  # noqa: BLE001 - the outcome is what the test reads
      out.append(e)

  thread = threading.Thread(target=run, daemon=True)
  thread.start()
  thread.join(60)
  if thread.is_alive():
    unblock()
    thread.join()
    return "blocked"
  return out[0]


def test_1_workers_never_run_as_root(sandbox):
  """Layers: the user namespace's id map and the drop to nobody (ids), the tmpfs's nosuid,
  nodev and noexec (mount flags), no_new_privs (prctl)."""
  ns = fresh(sandbox, "root")
  for key in ("unprivileged_user", "no_new_privs", "writable_mounts_noexec",
              "capabilities_dropped"):
    assert sandbox.enforced[key], key
  uid, euid, gid, egid, groups, scratch_owner = sandbox.call(ns, "whoami", {})
  assert 0 not in (uid, euid, gid, egid, *groups)
  with open(f"/proc/{worker_pid(sandbox, ns)}/status") as f:  # the host's view of its ids
    status = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
  assert "0" not in status["Uid"].split() + status["Gid"].split() + status["Groups"].split()
  assert status["NoNewPrivs"] == "1" and int(status["CapEff"], 16) == 0
  copy = sandbox.call(ns, "setuid_copy", {})
  assert copy["made"][0] == "..: Read-only file system", copy
  assert copy["owner_uid"] != 0 and copy["mount_nosuid"]
  assert os.listdir(sandbox.scratch) == []
  view = sandbox.call(ns, "writable_mounts", {})
  assert set(view["mounts"]) == {view["cwd"], "/proc"}
  assert all(all(flags) for flags in view["mounts"].values()), view


def test_2_the_scratch_tmpfs_is_the_only_writable_place(sandbox):
  """Layers: every mount read-only in the zygote's view, the scratch root read-only in the
  worker's (mounts). Zero bytes reach the host's disk."""
  ns = fresh(sandbox, "disk")
  with tempfile.TemporaryDirectory() as folder:
    os.chmod(folder, 0o777)  # open to any user: only the mount can stop the write
    routes = sandbox.call(ns, "write_outside", {"folder": folder})
    assert os.listdir(folder) == []
  assert set(routes.values()) <= {"Read-only file system", "No such file or directory"}, routes
  assert routes["dir_fd"] == routes["dotdot"] == routes["tmp"] == "Read-only file system"
  assert os.listdir(sandbox.scratch) == [] and os.stat(sandbox.scratch).st_blocks <= 8
  assert not os.path.exists("/tmp/tirjax-escape")


def test_3_names_the_owner_makes_cannot_be_squatted(sandbox, monkeypatch):
  """Layers: the scratch root read-only to workers (mounts), random names, a clash a
  ToolError."""
  ns = fresh(sandbox, "squat")
  guesses = [files.new_name() for _ in range(5)]
  assert set(sandbox.call(ns, "squat", {"names": guesses})) == {"Read-only file system"}
  monkeypatch.setattr(files, "new_name", iter(guesses + guesses).__next__)
  for i in range(5):
    sandbox.define(f"later{i}", "x = 1")
  for i in range(5):  # the same names again: each a clash in the zygote's folder
    with pytest.raises(ToolError, match="failed to start .*FileExistsError"):
      sandbox.define(f"clash{i}", "x = 1")
  for i in range(5):
    sandbox.drop(f"later{i}")


def test_4_a_deep_tree_breaks_no_later_sandbox(sandbox, monkeypatch, tmp_path):
  """Layers: the worker's tmpfs goes with its mount namespace (no walk at all); a tree on the
  host's disk (without namespaces, or a dead owner's) is removed without recursion."""
  ns = fresh(sandbox, "deep")
  assert sandbox.call(ns, "deep_tree", {"depth": 3000}) == 3000
  sandbox.drop(ns)  # raised RecursionError before
  with open("/proc/sys/kernel/pid_max") as f:
    dead = int(f.read())  # pids stay below pid_max: no process has this one
  # On a tmpfs where there is one: an rmdir on this VM's ext4 takes 3 ms.
  base = tempfile.mkdtemp(dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else tmp_path)
  monkeypatch.setattr(tempfile, "tempdir", base)
  orphan = pathlib.Path(base, f"{files.SCRATCH_PREFIX}{dead}-x")
  try:
    with Sandbox(dataclasses.replace(LIMITS, isolate_network=False)) as flat:
      flat.define("t", ATTACKER)  # its scratch folder lies on the host's disk
      assert flat.call("t", "deep_tree", {"depth": 1500}) == 1500  # beyond recursion's 1000
      flat.drop("t")
    orphan.mkdir()
    fd = os.open(orphan, os.O_RDONLY)
    for _ in range(1500):
      os.mkdir("d", dir_fd=fd)
      fd, old = os.open("d", os.O_RDONLY, dir_fd=fd), fd
      os.close(old)
    os.symlink("/etc/passwd", "link", dir_fd=fd)
    os.close(fd)
    with Sandbox(LIMITS) as later:  # its clean-up of dead owners' folders walks that tree
      later.define("t", "x = 1")
    assert os.listdir(base) == [] and os.path.exists("/etc/passwd")  # and no link followed
  finally:
    files.remove_tree(base)


def test_5_a_worker_cannot_reopen_its_request_pipe(sandbox):
  """Layer: the ids. The owner made the pipes (mode 0600, its own), so the worker's user may
  use the ends it was given and open neither again."""
  with pytest.raises(ToolError, match="PermissionError: .*Permission denied"):
    sandbox.call(fresh(sandbox, "reopen"), "reopen_request_pipe", {})


def test_5_the_owner_never_blocks_on_a_worker_that_stops_reading(sandbox):
  """Layers: non-blocking pipe ends, the call's deadline on the write (the worker killed).
  A SIGCONT handler that never returns: the worker, resumed for a 200 kB request, reads
  none of it."""
  ns = fresh(sandbox, "stall")
  pid = worker_pid(sandbox, ns)
  assert sandbox.call(ns, "stall_on_resume", {}) == "armed"
  outcome = returns(lambda: os.kill(pid, signal.SIGKILL), sandbox.call, ns, "echo",
                    {"x": "q" * 200_000})
  assert isinstance(outcome, ToolError), outcome
  assert "stopped reading its requests" in str(outcome) and not alive(pid)
  assert sandbox.call("a", "echo", {"x": 7}) == 7  # the lock was released


@pytest.mark.parametrize("kind, why", [("nested", "nested more than"),
                                       ("deep", "nested more than"),
                                       ("no_result", "whose keys are not"),
                                       ("not_a_string", "whose stdout or error is not a string")])
def test_6_replies_are_checked_before_they_are_trusted(sandbox, kind, why):
  """Layers: the nesting measured before parsing, the schema (`_sandbox_wire.check_reply`);
  the worker is killed, so it burns no CPU afterwards."""
  ns = fresh(sandbox, f"reply-{kind}")
  pid, restarts = worker_pid(sandbox, ns), sandbox.restarts
  with pytest.raises(ToolError, match=f"the tool process sent a reply {why}.*killed"):
    sandbox.call(ns, "raw_reply", {"kind": kind})
  assert not alive(pid) and sandbox.restarts == restarts + 1
  assert sandbox.call(ns, "echo", {"x": 3}) == 3  # a fresh worker


def test_7_memory_and_ipc_stay_inside_the_limit(sandbox):
  """Layers: seccomp (memfd, SysV and POSIX IPC objects refused), RLIMIT_AS (a shared
  mapping is counted), an IPC namespace per worker."""
  ns = fresh(sandbox, "memory")
  calls = syscall_numbers(["memfd_create", "shmget", "msgget", "semget", "mq_open"])
  args = {"memfd_create": [0, 0], "shmget": [0, 1 << 20, 0o1600], "msgget": [0, 0o1600],
          "semget": [0, 1, 0o1600], "mq_open": [0, 0]}  # IPC_PRIVATE, IPC_CREAT | 0600
  refused = {name: sandbox.call(ns, "syscall_errno", {"nr": nr, "args": args[name]})
             for name, nr in calls.items()}
  assert refused == {name: 1 for name in calls}  # EPERM
  with pytest.raises(ToolError, match="Cannot allocate memory"):
    sandbox.call(ns, "shared_mapping", {"mb": LIMITS.memory_mb + 64})
  assert sandbox.enforced["ipc_namespace"]
  links = {os.readlink(f"/proc/{worker_pid(sandbox, n)}/ns/ipc") for n in (ns, "a")}
  assert len(links) == 2 and os.readlink("/proc/self/ns/ipc") not in links


def test_8_the_owner_holds_output_to_the_limit(sandbox):
  """Layer: the owner measures the decoded reply (tool code rewrote it after the worker's own
  check); the worker is killed."""
  limit = LIMITS.max_output_chars
  for attack in ("rewrite_reply", "sneaky_result"):
    ns = fresh(sandbox, attack)
    with pytest.raises(ToolError, match=f"tool output too large: .* \\(limit {limit};"):
      sandbox.call(ns, attack, {"n": limit + 50_000})


@pytest.mark.parametrize("call, args", [("io_uring_setup", [1, 0]), ("userfaultfd", [1]),
                                        ("keyctl", [0, -4, 1]), ("add_key", [0, 0, 0, 0, -2]),
                                        ("request_key", [0, 0, 0, 0])])
def test_10_io_uring_userfaultfd_and_keyrings_are_refused(sandbox, call, args):
  """Layer: seccomp. userfaultfd(UFFD_USER_MODE_ONLY) and the user keyring work without it."""
  ns = "a-kernel"
  if ns not in sandbox._spaces:
    fresh(sandbox, ns)
  nr = syscall_numbers([call])[call]
  assert sandbox.call(ns, "syscall_errno", {"nr": nr, "args": args}) == 1  # EPERM


def test_10_tool_code_sees_none_of_the_owners_environment(sandbox):
  """Layers: the zygote started with an empty environment, the worker clears its own."""
  assert os.environ.get(SECRET) is None  # the fixture's secret was the owner's then
  seen = sandbox.call("a", "environment", {})
  assert set(seen["env"]) == {"HOME", "TMPDIR", "PATH"}
  assert not any("sk-do-not-leak" in text for text in seen["proc"])
  # The environment the process started with stays in its memory, where native tool code
  # could read it: the owner reads it here.
  with open(f"/proc/{worker_pid(sandbox, 'a')}/environ", "rb") as f:
    assert b"sk-do-not-leak" not in f.read()
