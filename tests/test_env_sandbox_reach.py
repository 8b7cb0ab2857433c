"""The sandbox against the attacks of issue 56 on the owner's side, one test per attack class,
as root on CI's machine. Each test names the layer that stops its attack; the tool code's
attacks run with the audit hook off, so that the kernel's or the owner's layer is what holds.
"""

import dataclasses
import os
import resource
import shutil
import socket
import tempfile
import threading
import time

import pytest

from tirjax.env.sandbox import Sandbox, SandboxLimits, kernel_isolation_available
from tirjax.env.tools import ToolError
from tirjax.testing.sandbox_probes import (HOOK_OFF, libseccomp_loads, syscall_numbers,
                                           worker_pid)

LIMITS = SandboxLimits(timeout_s=1.0, grace_s=0.5, memory_mb=256, max_file_mb=4,
                       scratch_mb=16, max_output_chars=100_000)


def children() -> set:
  """The pids of this process's children (a zygote is one; its workers are its own)."""
  out = set()
  for task in os.listdir("/proc/self/task"):
    with open(f"/proc/self/task/{task}/children") as f:
      out.update(int(pid) for pid in f.read().split())
  return out


def test_close_is_final_even_when_threads_race_it():
  """Layer: close() marks the sandbox closed under its lock, and every method checks it
  first. Threads keep calling and defining while the sandbox closes; afterwards every method
  raises ToolError and no process of it is left, or started again."""
  before = children()
  sb = Sandbox(LIMITS)
  sb.define("a", "def f(x):\n    return x")
  assert children() - before  # its zygote
  started, outcomes = threading.Barrier(5), []

  def hammer(i):
    started.wait()
    while True:
      try:
        if i % 2:
          sb.call("a", "f", {"x": i})
        else:
          sb.define(f"n{i}", "y = 1")
      except ToolError as e:
        if "closed" in str(e):
          outcomes.append(str(e))
          return
        raise

  threads = [threading.Thread(target=hammer, args=(i,)) for i in range(4)]
  for thread in threads:
    thread.start()
  started.wait()
  sb.close()
  for thread in threads:
    thread.join(30)
  assert outcomes == ["the sandbox is closed"] * 4
  for method, args in [(sb.call, ("a", "f", {"x": 1})), (sb.define, ("b", "x = 1")),
                       (sb.drop, ("a",)), (sb.preload, (["json"],))]:
    with pytest.raises(ToolError, match="the sandbox is closed"):
      method(*args)
  sb.close()  # again: nothing to do
  assert children() <= before


@pytest.fixture
def many_open_files():
  """1,100 open descriptors in the owner (its limit raised for them), closed afterwards: the
  sandbox's own pipes and sockets then get numbers from 1100 up."""
  soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
  if hard != resource.RLIM_INFINITY and hard < 2048:
    pytest.skip(f"RLIMIT_NOFILE's hard limit is {hard} here")
  resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
  held = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
  try:
    yield held
  finally:
    for fd in held:
      os.close(fd)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_an_owner_holding_1100_descriptors_still_runs_tools(many_open_files):
  """Layer: the owner waits with poll, which takes any descriptor number (select refused
  those from 1024 up with a ValueError, not a ToolError)."""
  with Sandbox(LIMITS) as sb:
    sb.define("a", "def f(x):\n    return x\ndef spin():\n    while True:\n        pass")
    assert sb._workers["a"]._replies >= 1024  # the pipe the owner waits on
    assert sb.call("a", "f", {"x": 5}) == 5
    with pytest.raises(ToolError, match="timed out after 1.0 s"):
      sb.call("a", "spin", {})
    assert sb.call("a", "f", {"x": 6}) == 6


REPLIER = HOOK_OFF + r'''
import gc, io, json, os, sys

def _request_id():
    frame = sys._getframe()
    while frame.f_code.co_name != "handle":
        frame = frame.f_back
    return frame.f_locals["req"]["id"]

def answer_ahead():
    """Issue 56 §6: this worker's reply to this request, and in the same write a reply to the
    next request's id, which that request must not get without running."""
    rid = _request_id()
    replies = next(f for f in gc.get_objects() if isinstance(f, io.TextIOWrapper)
                   and f.mode == "w" and not f.closed and f.fileno() > 2)
    write = replies.write
    def write_two(text):
        del replies.write  # once
        forged = {"id": rid + 1, "ok": True, "result": "FORGED", "stdout": ""}
        return write(text + json.dumps(forged) + "\n")
    replies.write = write_two
    return "honest"

def echo(x):
    return x
'''


def test_a_reply_written_ahead_never_answers_the_next_request():
  """Layer: the owner drops what a worker wrote beyond its reply before it sends the next
  request (the worker is stopped meanwhile), and takes only the reply to the id it sent."""
  with Sandbox(LIMITS) as sb:
    sb.define("r", REPLIER)
    assert sb.call("r", "hook_off", {})
    pid = worker_pid(sb, "r")
    assert sb.call("r", "answer_ahead", {}) == "honest"
    assert sb.call("r", "echo", {"x": "ran"}) == "ran"
    assert worker_pid(sb, "r") == pid and sb.restarts == 0  # the same worker, not killed


ATTACKER = HOOK_OFF + r'''
import errno, fcntl, os, socket, termios

def _outcome(fn):
    try:
        fn()
        return "done"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))

def reach_host(stream_path, dgram_path, abstract):
    """Issue 56 §1: every route to a listener of the host's."""
    def connect(family, kind, address, data=b"escaped"):
        def go():
            s = socket.socket(family, kind)
            s.connect(address)
            s.send(data)
        return go
    return {"path_stream": _outcome(connect(socket.AF_UNIX, socket.SOCK_STREAM, stream_path)),
            "path_dgram": _outcome(connect(socket.AF_UNIX, socket.SOCK_DGRAM, dgram_path)),
            "abstract": _outcome(connect(socket.AF_UNIX, socket.SOCK_STREAM, abstract)),
            "vsock": _outcome(lambda: socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)),
            "inet": _outcome(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM)),
            "netlink": _outcome(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW)),
            "socketpair": _outcome(socket.socketpair)}

def syscall_errno(nr, args):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    result = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return 0 if result >= 0 else errno.errorcode[ctypes.get_errno()]

_held = []

def hold_kernel_memory(cap):
    """Issue 56 §2: kernel buffers RLIMIT_AS does not count, held until the next call: 1,000
    socketpairs, then pipes, each grown to 1 MiB and filled, until the limit (or `cap`)."""
    out = {"socketpairs": _outcome(lambda: [_held.append(socket.socketpair())
                                            for _ in range(1000)])}
    queued, grown, pipes = 0, [], 0
    while queued < cap:
        try:
            r, w = os.pipe()
        except OSError as e:
            out["pipes_stopped_by"] = errno.errorcode[e.errno]
            break
        _held.append((r, w))
        pipes += 1
        grown.append(_outcome(lambda: fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)))
        os.set_blocking(w, False)
        try:
            while True:
                os.write(w, b"x" * 65536)
        except BlockingIOError:
            pass
        queued += int.from_bytes(fcntl.ioctl(r, termios.FIONREAD, b"\0" * 4), "little")
    out.update(pipes=pipes, queued=queued, grown=sorted(set(grown)))
    return out
'''


@pytest.fixture(scope="module")
def contained():
  if not kernel_isolation_available():
    pytest.skip("no user, PID and mount namespaces on this machine")
  if not libseccomp_loads():
    pytest.skip("libseccomp is not installed on this machine")


def attacker(sb, ns):
  sb.define(ns, ATTACKER)
  assert sb.call(ns, "hook_off", {})
  return ns


def test_tool_code_reaches_no_socket_of_the_hosts(contained, tmp_path_factory):
  """Layer: seccomp refuses socket() and socketpair() (every family) in the workers. Host
  listeners on a 0777 path socket under /tmp (which the read-only mount shows), a datagram
  one and an abstract one receive nothing; AF_VSOCK, AF_INET and netlink cannot be made."""
  folder = tempfile.mkdtemp(prefix="tirjax-56-", dir="/tmp")
  os.chmod(folder, 0o777)
  listeners = []
  try:
    stream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stream.bind(os.path.join(folder, "stream"))
    stream.listen()
    dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dgram.bind(os.path.join(folder, "dgram"))
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind(f"\0tirjax-56-{os.getpid()}")
    abstract.listen()
    listeners = [stream, dgram, abstract]
    for s in listeners:
      s.setblocking(False)
    for name in ("stream", "dgram"):
      os.chmod(os.path.join(folder, name), 0o777)
    with Sandbox(LIMITS) as sb:
      routes = sb.call(attacker(sb, "s"), "reach_host", {
          "stream_path": os.path.join(folder, "stream"),
          "dgram_path": os.path.join(folder, "dgram"), "abstract": f"\0tirjax-56-{os.getpid()}"})
    assert routes == dict.fromkeys(routes, "EPERM"), routes
    for s in (stream, abstract):
      with pytest.raises(BlockingIOError):
        s.accept()
    with pytest.raises(BlockingIOError):
      dgram.recv(64)
  finally:
    for s in listeners:
      s.close()
    shutil.rmtree(folder)


def test_kernel_buffers_stay_inside_the_documented_bound(contained):
  """Layers: seccomp refuses socketpair() and fcntl(F_SETPIPE_SZ); RLIMIT_NOFILE
  (`max_open_files`) bounds the pipes. The kernel's own count of what the worker's pipes
  hold (FIONREAD) stays within max_open_files / 2 * 64 KiB (2 MiB here), against 444 MiB of
  socket buffers before."""
  bound = LIMITS.max_open_files // 2 * 65536
  with Sandbox(LIMITS) as sb:
    held = sb.call(attacker(sb, "m"), "hold_kernel_memory", {"cap": 32 * bound})
  assert held["socketpairs"] == "EPERM" and held["grown"] == ["EPERM"], held
  assert held.get("pipes_stopped_by") == "EMFILE", held
  assert 0 < held["queued"] <= bound, held


class _TimedLock:
  """An RLock that records how long each outermost hold lasted."""

  def __init__(self):
    self._lock, self._depth, self._since, self.holds = threading.RLock(), 0, 0.0, []

  def __enter__(self):
    self._lock.acquire()
    self._depth += 1
    if self._depth == 1:
      self._since = time.monotonic()
    return self

  def __exit__(self, *exc):
    self._depth -= 1
    if self._depth == 0:
      self.holds.append(time.monotonic() - self._since)
    self._lock.release()


def test_an_episode_with_evictions_costs_at_most_one_budget_per_call():
  """Layer: every call has one budget (`call_budget_s`, here 2 * (0.5 + 0.25) s) for all it
  does, a stateful namespace's replay included; a namespace whose replay does not fit is
  refused, at no cost, from then on. With one worker alive at a time, each call of the
  stateful namespace (0.3 s of work) follows an eviction and replays all before it: without
  the budget its k-th call costs 0.3 k s (4.8 s for the 16th, 41 s in all) and none is
  refused. The sandbox's lock, which another thread's calls of a third namespace wait on, is
  never held longer than one budget. The slack absorbs a loaded 2-core machine's scheduling;
  the refusals do not depend on timing."""
  limits = dataclasses.replace(LIMITS, timeout_s=0.5, grace_s=0.25, max_workers=1)
  budget, n = limits.budget_s, 16
  code = "import time\nstate = []\ndef push(v):\n    time.sleep(0.3)\n    state.append(v)\n" \
         "    return len(state)\ndef f(x):\n    return x"
  with Sandbox(limits) as sb:
    sb._lock = lock = _TimedLock()  # pylint: disable=protected-access
    sb.define("a", code, stateful=True)
    sb.define("b", code)
    sb.define("c", code)
    done = threading.Event()

    def other():  # an unrelated namespace, in another thread
      while not done.is_set():
        assert sb.call("c", "f", {"x": 1}) == 1

    thread = threading.Thread(target=other)
    thread.start()
    took, outcomes = [], []
    try:
      for i in range(n):
        t0 = time.monotonic()
        try:
          outcomes.append(sb.call("a", "push", {"v": i}))
        except ToolError as e:
          outcomes.append(str(e))
        took.append(time.monotonic() - t0)
        assert sb.call("b", "f", {"x": 2}) == 2  # evicts "a"
    finally:
      done.set()
      thread.join(60)
  served = [o for o in outcomes if isinstance(o, int)]
  assert served == list(range(1, len(served) + 1)) and len(served) >= 2, outcomes
  refusals = outcomes[len(served):]
  assert refusals and all("is refused: replaying its" in r and "does not fit" in r
                          for r in refusals), outcomes
  slack = 1.0
  assert max(lock.holds) <= budget + slack, sorted(lock.holds)[-5:]
  assert max(took[len(served):]) <= slack, took  # a refusal costs nothing


@pytest.mark.parametrize("call, args", [("inotify_init1", [0]), ("inotify_init", []),
                                        ("perf_event_open", [0, 0, -1, -1, 0])])
def test_watching_names_and_host_counters_is_refused(contained, call, args):
  """Layer: seccomp. inotify (issue 56: a watch on /tmp showed tool code the names the owner
  makes) works for nobody without it; perf_event_open fails on its NULL attributes (EFAULT)
  without it."""
  nr = syscall_numbers([call]).get(call)
  if nr is None:
    pytest.skip(f"no {call} on this architecture")
  with Sandbox(LIMITS) as sb:
    assert sb.call(attacker(sb, "w"), "syscall_errno", {"nr": nr, "args": args}) == "EPERM"
