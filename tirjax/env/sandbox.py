"""A sandbox for dataset-supplied tool code (ToolHop, FTRL, BFCL back-ends; spec §6).

Each namespace's tool code runs in a worker process of its own, which speaks JSON over its own
pipes: no tool shares an interpreter, a reply channel or an audit hook with another, so one
namespace can neither read nor replace another's objects, nor forge its replies. Workers are
forked, already prepared, from one zygote process per sandbox (`_sandbox_worker.py`); code is
defined once per namespace and called many times. At most `max_workers` workers live at a
time: the least recently used one is closed to make room, and its namespace is re-defined
when next called (one marked stateful also replays its successful calls, as after a worker
that was killed), so an episode's state survives both. A call's whole wall time, replay
included, is bounded by one budget (`call_budget_s`); a namespace whose replay does not fit
is refused. `close()` is final.

What is enforced, from the outside in. The kernel contains the tool code where the machine
permits it (`Sandbox.enforced` says what was in force, layer by layer; the owner reads some of
it off each worker's process itself); the audit hook is a defence in depth that gives friendly
errors, not the boundary:

* a separate process per namespace with a wall-clock limit: the tool gets `timeout_s` (an
  interval timer raises inside it), and a worker that has not answered `grace_s` later is
  killed (through a pidfd); between requests it is stopped (SIGSTOP), so nothing tool code
  leaves behind (a signal handler armed by a timer) runs outside a call;
* an owner that never blocks on a worker: its pipe ends are non-blocking (waited on with
  poll, whatever their number), writing a request and reading its reply share the call's
  deadline, and a worker that stops reading is killed; what a worker wrote beyond its last
  reply is dropped before the next request; a reply is checked before it is trusted (a byte
  cap, its nesting measured before parsing, its schema, the id of the request in flight),
  and `max_output_chars` is applied again to what arrived; a worker whose reply fails is
  killed;
* the zygote in user, network, IPC, PID and mount namespaces of its own; each worker then in
  its own PID namespace (it is their init and sees no other process), mount namespace (every
  mount read-only, nosuid and nodev, its own /proc) and empty network and IPC namespaces;
* never root: where the owner is root, the zygote's user namespace maps root to root and
  nobody to nobody, and each worker becomes nobody (uid and gid 65534, no groups) once its
  interpreter is loaded; folders on the way to the interpreter that nobody may not enter
  (pyenv under a private /root) are shown to it through read-only bind mounts in the
  zygote's mount namespace, and nothing else of them. Otherwise a worker keeps the owner's
  unprivileged ids. No capabilities, no_new_privs, not dumpable;
* one writable place: a tmpfs of `scratch_mb` per worker in its own mount namespace, nosuid,
  nodev and noexec, private to it and gone with it. Its mount point lies in a tmpfs the
  zygote lays over `Sandbox.scratch`, read-only to the workers, so nothing a worker does
  reaches the host's disk (that folder stays empty); the names of the mount points are
  random. RLIMIT_FSIZE (`max_file_mb`) bounds one file, RLIMIT_AS (`memory_mb`: an
  allocation beyond it raises MemoryError in the tool) the memory, RLIMIT_NOFILE
  (`max_open_files`) the pipes and with them their kernel buffers, no core files;
* a seccomp filter (libseccomp) under which the kernel refuses every new process and every
  new thread (a worker runs none: clone is refused with or without CLONE_THREAD, clone3 with
  ENOSYS), signals and ptrace to other processes, mounts and namespace changes, memory that
  RLIMIT_AS does not count (memfd, SysV and POSIX IPC objects, pipes grown past 64 KiB),
  sockets of every family (a host's socket file is reachable through a read-only mount, and
  their buffers are kernel memory), io_uring, userfaultfd, the keyrings, inotify and
  fanotify, perf events and bpf;
* an empty environment: nothing of the owner's (API keys) reaches tool code;
* a lifeline: the zygote exits when its owner's end of the control socket closes (the owner
  died, even by SIGKILL), and its workers and their tmpfs folders go with it; scratch
  folders of dead owners are removed by the next Sandbox, by a walk no tree breaks;
* the audit hook (PEP 578) refuses sockets and the network modules, process creation, new
  threads, `ctypes`, `resource.setrlimit`, and writes outside the scratch folder (the
  worker's cwd, HOME, TMPDIR) with a message naming what was refused. Tool code can switch it
  off in its own worker (it is Python, reachable through `gc`); every layer above still holds.

Where the machine has no unprivileged user namespaces, the workers run without the network,
PID, mount and IPC namespaces and the scratch quota, and `enforced` reports it (README,
Security notes).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import tempfile
import threading
import time
import weakref
from typing import Any, Mapping, Optional, Sequence

from tirjax import option_checks
from tirjax.env import _sandbox_files as files
from tirjax.env import _sandbox_host as host
from tirjax.env import _sandbox_wire as wire
from tirjax.env.tools import ToolError


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
  timeout_s: float = 5.0  # per definition or call
  grace_s: float = 2.0  # extra wall time before the worker is killed
  memory_mb: int = 1024  # address-space limit of each worker
  max_file_mb: int = 16
  scratch_mb: int = 64  # each worker's scratch folder (a tmpfs), all files together
  max_output_chars: int = 100_000
  isolate_network: bool = True
  # Descriptors a worker may hold open (RLIMIT_NOFILE): pipes are kernel memory that
  # RLIMIT_AS does not count, at most max_open_files / 2 * 64 KiB of it (sockets are refused).
  max_open_files: int = 64
  # Workers alive at a time (one per namespace; the least recently used is closed beyond).
  # The memory tool code can hold is at most max_workers * (memory_mb + scratch_mb +
  # max_open_files * 32 KiB) (README, Security notes).
  max_workers: int = 64
  # The most one call() may take in all, worker start, definition and a stateful namespace's
  # replay included (None: 2 * (timeout_s + grace_s)); it is also the longest the sandbox's
  # lock is held. A replay gets what is left after one request's time (timeout_s + grace_s).
  call_budget_s: Optional[float] = None

  @property
  def budget_s(self) -> float:
    """`call_budget_s`, or its default."""
    if self.call_budget_s is not None:
      return self.call_budget_s
    return 2 * (self.timeout_s + self.grace_s)

  def __post_init__(self):
    for name in ("timeout_s", "grace_s"):
      option_checks.above(name, getattr(self, name), 0)
    option_checks.at_least("memory_mb", self.memory_mb, 128, why="the interpreter needs it")
    option_checks.at_least("max_open_files", self.max_open_files, 16,
                           why="the interpreter and its pipes need some")
    for name in ("max_file_mb", "scratch_mb", "max_output_chars", "max_workers"):
      option_checks.at_least(name, getattr(self, name), 1)
    if self.call_budget_s is not None:
      option_checks.at_least("call_budget_s", self.call_budget_s, self.timeout_s + self.grace_s,
                             why="a call needs at least one request's time")


@dataclasses.dataclass
class _Space:
  code: str
  variables: Mapping[str, Any]
  stateful: bool
  error: Optional[str] = None  # the definition raised: every call reports this
  refused: Optional[str] = None  # its replay does not fit a call's budget: every call says so
  replay: list = dataclasses.field(default_factory=list)  # (target, arguments, seconds)
  define_s: float = 0.0  # what its definition took, the first step of every replay

  @property
  def replay_s(self) -> float:
    """What restoring it takes, as measured when each step first ran."""
    return self.define_s + sum(seconds for _, _, seconds in self.replay)


def network_namespace_available() -> bool:
  """Whether a user namespace with a network namespace can be made here (probed once per
  process)."""
  return host.unshare_works("network")


def kernel_isolation_available() -> bool:
  """Whether the user, network, IPC, PID and mount namespaces can all be made here (probed
  once)."""
  return host.unshare_works("contained")


# Layers each worker (or the zygote) reports as it starts, or the owner reads off each worker
# (unprivileged_user, no_new_privs, ipc_namespace): False until one has.
_REPORTED = ("pid_namespace", "readonly_filesystem", "scratch_quota", "capabilities_dropped",
             "seccomp", "threads_refused", "writable_mounts_noexec", "unprivileged_user",
             "no_new_privs", "ipc_namespace")


class Sandbox:
  """Worker processes for untrusted tool code, one per namespace. Thread-safe (calls
  serialise)."""

  def __init__(self, limits: SandboxLimits = SandboxLimits()):
    self.limits = limits
    self.restarts = 0  # workers killed or found dead (their namespaces then restart)
    self._spaces: dict[str, _Space] = {}
    self._workers: collections.OrderedDict[str, host.WorkerProcess] = (
        collections.OrderedDict())  # live ones, least recently used first
    self._lock = threading.RLock()
    self._closed = False  # set once, under the lock, by close(): nothing starts after it
    self._request_id = 0
    self._preload: list[str] = []
    files.remove_orphaned_scratch()
    self._scratch = tempfile.mkdtemp(prefix=f"{files.SCRATCH_PREFIX}{os.getpid()}-")
    mode = ("none" if not limits.isolate_network else
            "contained" if kernel_isolation_available() else
            "network" if network_namespace_available() else "none")
    if mode != "contained" and host.worker_ids() is not None:
      os.chmod(self._scratch, 0o711)  # the workers' folders lie on the host's disk
    # A reply holds at most the limited output, result and error, JSON-escaped (x6 at worst).
    max_line = 24 * limits.max_output_chars + (1 << 16)
    self._zygote = host.Zygote(self._scratch, dict(
        timeout_s=limits.timeout_s, memory_bytes=limits.memory_mb << 20,
        max_file_bytes=limits.max_file_mb << 20, scratch_bytes=limits.scratch_mb << 20,
        max_output_chars=limits.max_output_chars, max_open_files=limits.max_open_files),
        mode, max_line)
    # The zygote (and with it every worker) is killed and the scratch folder removed on
    # close(), on garbage collection or at interpreter exit, whichever comes first.
    self._cleanup = weakref.finalize(self, _cleanup, self._workers, self._zygote,
                                     self._scratch)
    self.enforced = {
        "process": True, "worker_per_namespace": True, "timeout": True, "memory_limit": True,
        "file_size_limit": True, "network_namespace": mode != "none", "audit_hook": True,
        "parent_death": True, **{k: False for k in _REPORTED}}
    self._reported: set[str] = set()

  # -- public API -------------------------------------------------------------------------

  def define(self, ns: str, code: str, variables: Optional[Mapping[str, Any]] = None, *,
             stateful: bool = False) -> str:
    """Runs `code` in a fresh worker for namespace `ns` now; returns what it printed.

    Raises `ToolError` if the code fails; later calls into `ns` then report that failure.
    `variables` (JSON values) are set as globals first. A `stateful` namespace records its
    successful calls and replays them after a worker restart.
    """
    with self._lock:
      self._check_open()
      space = _Space(code, dict(variables or {}), stateful)
      self._spaces[ns] = space
      self._retire(ns)
      deadline = time.monotonic() + self.limits.timeout_s + self.limits.grace_s
      return self._materialise(ns, space, deadline)

  def call(self, ns: str, target: str, arguments: Mapping[str, Any]) -> Any:
    """Calls `target` ("f" or "obj.method") of namespace `ns`; raises `ToolError` on failure."""
    with self._lock:
      self._check_open()
      deadline = time.monotonic() + self.limits.budget_s  # for everything below
      space = self._spaces.get(ns)
      if space is None:
        raise ToolError(f"sandbox namespace {ns!r} was never defined")
      if space.refused is not None:
        raise ToolError(space.refused)
      if space.error is None and ns not in self._workers:
        self._restore(ns, space, deadline)
      if space.error is not None:
        raise ToolError(f"the tool code failed to load: {space.error}")
      started = time.monotonic()
      reply = self._request(ns, {"op": "call", "ns": ns, "target": target,
                                 "arguments": dict(arguments)}, deadline)
      if not reply["ok"]:
        raise ToolError(reply["error"])
      if space.stateful:
        space.replay.append((target, dict(arguments), time.monotonic() - started))
      return reply["result"]

  def preload(self, modules: Sequence[str]) -> dict:
    """Imports `modules` once, in the zygote, so that every worker started from now on has
    them (a BFCL episode's worker then need not import its back-end's classes again). Only
    for installed packages' own code: it runs outside the workers' seccomp filter and hook
    (inside the zygote's namespaces). Returns {module: error} of those that failed."""
    with self._lock:
      self._check_open()
      self._preload += [m for m in modules if m not in self._preload]
      if not self._zygote.alive:
        return {}  # imported when the zygote starts
      return self._zygote.preload(modules)

  def drop(self, ns: str) -> None:
    with self._lock:
      self._check_open()
      self._spaces.pop(ns, None)
      self._retire(ns)

  def close(self) -> None:
    """Kills every worker and the zygote. Final: from now on every method raises ToolError
    and starts nothing (a zygote started after close() would outlive the sandbox: nothing
    would ever stop it). A call in flight in another thread finishes first (it holds the
    lock, for at most one call's budget). Closing again does nothing."""
    with self._lock:
      self._closed = True
      self._cleanup()

  def _check_open(self) -> None:
    """Raises ToolError once the sandbox is closed (checked under the lock, so that a thread
    that waited for it while close() ran sees the close)."""
    if self._closed:
      raise ToolError("the sandbox is closed")

  def __enter__(self) -> "Sandbox":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  @property
  def scratch(self) -> str:
    """The folder under which each worker gets its scratch folder. Where the kernel contains
    the workers it stays empty on the host: the zygote covers it with a tmpfs of its own, and
    each worker's folder is a tmpfs in the worker's mount namespace."""
    return self._scratch

  @property
  def live_workers(self) -> int:
    return len(self._workers)

  # -- workers ----------------------------------------------------------------------------

  def _materialise(self, ns: str, space: _Space, deadline: float) -> str:
    """A worker for `ns` with its code run, by `deadline`."""
    started = time.monotonic()
    self._start_worker(ns, deadline)
    reply = self._request(ns, {"op": "exec", "ns": ns, "code": space.code,
                               "variables": space.variables}, deadline)
    if not reply["ok"]:
      if ns in self._workers:  # the code raised: it will every time
        space.error = reply["error"]
        self._retire(ns)
      raise ToolError(f"the tool code failed to load: {reply['error']}")
    space.define_s = max(space.define_s, time.monotonic() - started)
    return reply["stdout"]

  def _restore(self, ns: str, space: _Space, deadline: float) -> None:
    """`ns` defined again in a fresh worker and, stateful, its successful calls replayed, in
    what `deadline` leaves after one request's time (the call itself). A replay that did not
    fit, or that its history says will not, refuses the namespace from then on: each call
    then costs nothing, so an episode's calls cost at most one budget each, not a replay of
    the whole history after every kill or eviction (issue 56)."""
    room = deadline - (self.limits.timeout_s + self.limits.grace_s)
    if space.replay and time.monotonic() + space.replay_s > room:
      self._refuse(ns, space)
    self._materialise(ns, space, room if space.replay else deadline)
    for i, (target, arguments, _) in enumerate(space.replay):
      reply = self._request(ns, {"op": "call", "ns": ns, "target": target,
                                 "arguments": arguments}, room)
      if reply.get("budget"):
        self._refuse(ns, space)
      if not reply["ok"]:
        self._retire(ns)
        raise ToolError(f"namespace {ns!r} could not be restored: its replayed call {i + 1} "
                        f"({target}) failed: {reply['error']}")

  def _refuse(self, ns: str, space: _Space) -> None:
    """Refuses stateful namespace `ns` from now on: its replay does not fit a call."""
    self._retire(ns)
    limits = self.limits
    space.refused = (
        f"sandbox namespace {ns!r} is refused: replaying its {len(space.replay)} calls "
        f"(measured {space.replay_s:.2f} s) does not fit the "
        f"{limits.budget_s - limits.timeout_s - limits.grace_s:.2f} s a call's budget "
        f"(call_budget_s {limits.budget_s} s) leaves after the call's own time; define it "
        "again to start it afresh")
    raise ToolError(space.refused)

  def _start_worker(self, ns: str, deadline: float) -> None:
    while len(self._workers) >= self.limits.max_workers:
      self._retire(next(iter(self._workers)))  # the least recently used
    if not self._zygote.alive:
      self._zygote.close()
      self._note(self._zygote.start())
      if self._preload:
        self._zygote.preload(self._preload)
    worker, enforced = self._zygote.spawn(deadline)
    self._note(enforced)
    self._workers[ns] = worker

  def _note(self, report: Mapping[str, bool]) -> None:
    """A layer counts as enforced only while every process that reported it had it."""
    for key, value in report.items():
      self.enforced[key] = bool(value) and (self.enforced[key] or key not in self._reported)
      self._reported.add(key)

  def _retire(self, ns: str) -> None:
    worker = self._workers.pop(ns, None)
    if worker is not None:
      self._zygote.remove(worker)

  def _request(self, ns: str, req: dict, budget: float) -> dict:
    """Sends one request to `ns`'s worker and returns its checked reply, held to the limits;
    a dead or hung worker, or one whose reply fails the checks, is killed and the request
    fails (the namespace restarts on its next call). Nothing here waits past the request's
    deadline (timeout_s + grace_s), nor past `budget` (what its call has left): a reply
    "budget" marks a request killed for the latter."""
    worker = self._workers.get(ns)
    if worker is None:
      return {"ok": False, "error": "the tool process died", "stdout": ""}
    self._workers.move_to_end(ns)
    self._request_id += 1
    own = time.monotonic() + self.limits.timeout_s + self.limits.grace_s
    deadline = min(own, budget)
    unsent = worker.send({**req, "id": self._request_id}, deadline)
    if unsent == "timeout":
      return self._failed(ns, "the tool process stopped reading its requests (it was killed)")
    if unsent is not None:
      return self._failed(ns, "the tool process died")
    try:
      reply = worker.read(deadline, self._request_id)
    except wire.ReplyError as e:
      return self._failed(ns, f"the tool process sent {e} (it was killed)")
    if reply == "too_large":
      return self._failed(ns, "the tool process sent a reply over the size limit (it was "
                          "killed)")
    if reply == "timeout" and budget < own:
      return {**self._failed(ns, f"the call's budget of {self.limits.budget_s} s ran out "
                             "(the tool process was killed)"), "budget": True}
    if reply == "timeout":
      return self._failed(ns, f"timed out after {self.limits.timeout_s} s (the tool process "
                          "was killed)")
    if reply == "eof":
      return self._failed(ns, "the tool process died (it exited, or was killed for exceeding "
                          "a limit)")
    return self._held(ns, reply)

  def _held(self, ns: str, reply: dict) -> dict:
    """`max_output_chars` applied by the owner to what it received: output and error cut to
    it, a longer result refused. The worker refuses such a result itself, so one that
    arrives means its tool code rewrote the reply: the worker is killed."""
    limit = self.limits.max_output_chars
    reply["stdout"] = wire.held_to(reply["stdout"], limit)
    if not reply["ok"]:
      reply["error"] = wire.held_to(reply["error"], limit)
      return reply
    size = len(json.dumps(reply["result"], ensure_ascii=False))
    if size > limit:
      return self._failed(ns, f"tool output too large: {size} characters (limit {limit}; "
                          "the tool process was killed)")
    return reply

  def _failed(self, ns: str, message: str) -> dict:
    self._retire(ns)
    self.restarts += 1
    return {"ok": False, "error": message, "stdout": ""}


def _cleanup(workers: dict, zygote: host.Zygote, scratch: str) -> None:
  while workers:
    workers.popitem()[1].kill()
  zygote.close()
  try:
    files.remove_tree(scratch)
  except OSError:
    pass  # removed by the next Sandbox, as a dead owner's


class SandboxTool:
  """A `Tool.fn` that calls `target` in namespace `ns` of a sandbox."""

  def __init__(self, sandbox: Sandbox, ns: str, target: str):
    self.sandbox, self.ns, self.target = sandbox, ns, target

  def __call__(self, /, **arguments) -> Any:  # positional-only: an argument may be "self"
    return self.sandbox.call(self.ns, self.target, arguments)

  def __repr__(self) -> str:
    return f"SandboxTool({self.ns!r}, {self.target!r})"
