"""A sandbox for dataset-supplied tool code (ToolHop, FTRL, BFCL back-ends; SPEC §6).

Tool code runs in one persistent worker process (`_sandbox_worker.py`) that speaks JSON over
pipes. Code is defined once per namespace and called many times; the worker is restarted only
after it was killed (hard time-out) or died, and namespaces are then re-defined lazily (those
marked stateful also replay their successful calls, so an episode's state survives a restart).

What is enforced, from the outside in. The kernel contains the tool code where the machine
permits it (`Sandbox.enforced` says what was in force); the audit hook is a first layer that
gives friendly errors, not the boundary:

* a separate process with a wall-clock limit: the tool gets `timeout_s` (an interval timer
  raises inside it), and a worker that has not answered `grace_s` later is killed;
* a seccomp filter (libseccomp) under which the kernel refuses every new process (fork,
  `_posixsubprocess.fork_exec`, `os.system`, exec), whatever Python hook is bypassed;
* started by root, the worker runs as `nobody` (uid 65534) where nobody can run the
  interpreter, with RLIMIT_NPROC = 0 and no write permission on the system's files;
* `unshare --map-root-user --net --pid --fork --kill-child --mount --mount-proc`: an empty
  network namespace; a PID namespace whose init is the worker, so any process tool code
  starts dies with it; a mount namespace in which every mount but the scratch folder is
  read-only (so `dir_fd` tricks, `mkfifo` or native code cannot write outside it);
* RLIMIT_AS (`memory_mb`: an allocation beyond it raises MemoryError in the tool),
  RLIMIT_FSIZE (`max_file_mb`), no core files;
* a lifeline pipe: when the process that owns the Sandbox dies (even by SIGKILL), the worker
  empties its scratch folder and exits, taking its PID namespace with it; scratch folders of
  dead owners are removed by the next Sandbox;
* a Python audit hook (PEP 578, cannot be removed; it reads only its own closure) that refuses
  sockets and the network modules, process creation, new threads, `ctypes`,
  `resource.setrlimit`, and writes outside the scratch folder (the worker's cwd, HOME, TMPDIR);
* outputs and error messages beyond `max_output_chars` are cut; replies echo their request's
  id, so a line tool code writes to the reply pipe cannot shift later replies; each namespace
  has its own `__builtins__`, and the shared `builtins` module is restored after every call.

Where the machine has no unprivileged user namespaces, the worker runs without the network,
PID and mount namespaces, and `enforced` reports it (README, SECURITY).
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from typing import Any, Mapping, Optional

from tirjax.env.tools import ToolError

_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_worker.py")


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
  timeout_s: float = 5.0  # per definition or call
  grace_s: float = 2.0  # extra wall time before the worker is killed
  memory_mb: int = 1024  # address-space limit of the worker
  max_file_mb: int = 16
  max_output_chars: int = 100_000
  isolate_network: bool = True

  def __post_init__(self):
    for name in ("timeout_s", "grace_s"):
      if not getattr(self, name) > 0:
        raise ValueError(f"{name}: must be > 0, got {getattr(self, name)}")
    if self.memory_mb < 128:
      raise ValueError(f"memory_mb: must be >= 128 (the interpreter needs it), "
                       f"got {self.memory_mb}")
    if self.max_file_mb < 1:
      raise ValueError(f"max_file_mb: must be >= 1, got {self.max_file_mb}")
    if self.max_output_chars < 1:
      raise ValueError(f"max_output_chars: must be >= 1, got {self.max_output_chars}")


@dataclasses.dataclass
class _Space:
  code: str
  variables: Mapping[str, Any]
  stateful: bool
  error: Optional[str] = None  # the definition failed: every call reports this
  replay: list = dataclasses.field(default_factory=list)


NOBODY = 65534
_NET_ONLY = ["--map-root-user", "--net"]
_CONTAINED = _NET_ONLY + ["--pid", "--fork", "--kill-child", "--mount", "--mount-proc"]
_PROBED: dict[str, bool] = {}
_SCRATCH_PREFIX = "tirjax-sandbox-"


_NOBODY_RUNS_PYTHON: Optional[bool] = None


def _as_user() -> dict:
  """Popen arguments that drop root to nobody; nothing when not root, or when nobody cannot
  run this interpreter (e.g. one installed under a private /root)."""
  global _NOBODY_RUNS_PYTHON
  if os.geteuid() != 0:
    return {}
  drop = dict(user=NOBODY, group=NOBODY, extra_groups=[])
  if _NOBODY_RUNS_PYTHON is None:
    try:
      _NOBODY_RUNS_PYTHON = subprocess.run([sys.executable, "-I", "-c", ""], cwd="/",
                                           capture_output=True, timeout=30,
                                           **drop).returncode == 0
    except (OSError, subprocess.SubprocessError):
      _NOBODY_RUNS_PYTHON = False
  return drop if _NOBODY_RUNS_PYTHON else {}


def _unshare_works(flags: list[str]) -> bool:
  key = " ".join(flags)
  if key not in _PROBED:
    exe = shutil.which("unshare")
    try:
      _PROBED[key] = exe is not None and subprocess.run(
          [exe, *flags, "true"], capture_output=True, timeout=10, **_as_user()).returncode == 0
    except (OSError, subprocess.SubprocessError):
      _PROBED[key] = False
  return _PROBED[key]


def network_namespace_available() -> bool:
  """Whether `unshare --net --map-root-user` works here (probed once per process)."""
  return _unshare_works(_NET_ONLY)


def kernel_isolation_available() -> bool:
  """Whether the network, PID and mount namespaces can all be made here (probed once)."""
  return _unshare_works(_CONTAINED)


def _remove_orphaned_scratch() -> None:
  """Scratch folders whose owning process is gone (it was killed before it could clean up)."""
  tmp = tempfile.gettempdir()
  for name in os.listdir(tmp):
    if not name.startswith(_SCRATCH_PREFIX):
      continue
    owner = name[len(_SCRATCH_PREFIX):].split("-", 1)[0]
    if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
      shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)


class Sandbox:
  """A persistent worker process for untrusted tool code. Thread-safe (calls serialise)."""

  def __init__(self, limits: SandboxLimits = SandboxLimits()):
    self.limits = limits
    self.restarts = 0
    self._spaces: dict[str, _Space] = {}
    self._live: set[str] = set()  # namespaces defined in the current worker
    self._proc: Optional[subprocess.Popen] = None
    self._buf = b""
    self._lock = threading.RLock()
    _remove_orphaned_scratch()
    self._scratch = tempfile.mkdtemp(prefix=f"{_SCRATCH_PREFIX}{os.getpid()}-")
    self._lifeline: Optional[int] = None  # our end of the worker's lifeline pipe
    self._request_id = 0
    # The worker is killed and the scratch folder removed on close(), on garbage collection or
    # at interpreter exit, whichever comes first.
    self._pid = [None]  # the live worker's pid, for the finalizer
    self._cleanup = weakref.finalize(self, _cleanup, self._pid, self._scratch)
    self._namespaces = ([] if not limits.isolate_network else
                        _CONTAINED if kernel_isolation_available() else
                        _NET_ONLY if network_namespace_available() else [])
    # pid_namespace and readonly_filesystem are reported by each worker as it starts.
    self.enforced = {
        "process": True, "timeout": True, "memory_limit": True, "file_size_limit": True,
        "network_namespace": bool(self._namespaces), "pid_namespace": False,
        "readonly_filesystem": False, "seccomp": False, "audit_hook": True,
        "parent_death": True, "unprivileged_user": os.geteuid() != 0 or bool(_as_user())}

  # -- public API -------------------------------------------------------------------------

  def define(self, ns: str, code: str, variables: Optional[Mapping[str, Any]] = None, *,
             stateful: bool = False) -> str:
    """Runs `code` in a fresh namespace `ns` now; returns what it printed.

    Raises `ToolError` if the code fails; later calls into `ns` then report that failure.
    `variables` (JSON values) are set as globals first. A `stateful` namespace records its
    successful calls and replays them after a worker restart.
    """
    with self._lock:
      space = _Space(code, dict(variables or {}), stateful)
      self._spaces[ns] = space
      self._request({"op": "drop", "ns": ns})
      self._live.discard(ns)
      return self._materialise(ns, space)

  def call(self, ns: str, target: str, arguments: Mapping[str, Any]) -> Any:
    """Calls `target` ("f" or "obj.method") of namespace `ns`; raises `ToolError` on failure."""
    with self._lock:
      space = self._spaces.get(ns)
      if space is None:
        raise ToolError(f"sandbox namespace {ns!r} was never defined")
      if ns not in self._live:
        self._materialise(ns, space)
      if space.error is not None:
        raise ToolError(f"the tool code failed to load: {space.error}")
      reply = self._request({"op": "call", "ns": ns, "target": target,
                             "arguments": dict(arguments)})
      if not reply["ok"]:
        raise ToolError(reply["error"])
      if space.stateful:
        space.replay.append((target, dict(arguments)))
      return reply["result"]

  def drop(self, ns: str) -> None:
    with self._lock:
      if self._spaces.pop(ns, None) is not None and ns in self._live:
        self._live.discard(ns)
        self._request({"op": "drop", "ns": ns})

  def close(self) -> None:
    with self._lock:
      self._kill()
      self._cleanup()

  def __enter__(self) -> "Sandbox":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  @property
  def scratch(self) -> str:
    return self._scratch

  # -- worker management ------------------------------------------------------------------

  def _materialise(self, ns: str, space: _Space) -> str:
    reply = self._request({"op": "exec", "ns": ns, "code": space.code,
                           "variables": space.variables})
    if self._proc is not None:
      self._live.add(ns)
    space.error = None if reply["ok"] else reply["error"]
    if space.error is not None:
      raise ToolError(f"the tool code failed to load: {space.error}")
    for target, arguments in space.replay:
      self._request({"op": "call", "ns": ns, "target": target, "arguments": arguments})
    return reply["stdout"]

  def _start(self) -> None:
    os.makedirs(self._scratch, exist_ok=True)
    as_user = _as_user()
    if as_user:
      os.chown(self._scratch, NOBODY, NOBODY)
    lifeline_r, self._lifeline = os.pipe()
    cfg = dict(scratch=self._scratch, timeout_s=self.limits.timeout_s,
               memory_bytes=self.limits.memory_mb << 20,
               max_file_bytes=self.limits.max_file_mb << 20,
               max_output_chars=self.limits.max_output_chars,
               contain=self._namespaces is _CONTAINED, lifeline=lifeline_r)
    cmd = [sys.executable, "-I", "-B", _WORKER, json.dumps(cfg)]
    if self._namespaces:
      cmd = [shutil.which("unshare"), *self._namespaces] + cmd
    try:
      self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, start_new_session=True,
                                    cwd=self._scratch, pass_fds=(lifeline_r,), **as_user)
    finally:
      os.close(lifeline_r)
    self._pid[0] = self._proc.pid
    self._buf = b""
    self._live.clear()
    ready = self._read(deadline=time.monotonic() + 30.0, request_id=None)
    if not isinstance(ready, dict):
      self._kill()
      raise ToolError("the sandbox worker failed to start")
    self.enforced.update(ready.get("enforced", {}))

  def _kill(self) -> None:
    proc, self._proc = self._proc, None
    if proc is None:
      return
    _kill_group(proc.pid)
    self._pid[0] = None
    if self._lifeline is not None:
      os.close(self._lifeline)
      self._lifeline = None
    for f in (proc.stdin, proc.stdout):
      try:
        f.close()
      except OSError:
        pass
    proc.wait()
    self._live.clear()

  def _request(self, req: dict) -> dict:
    """Sends one request; a dead or hung worker is replaced and the request fails."""
    if self._proc is None:
      if req["op"] == "drop":
        return {"ok": True, "result": None, "stdout": ""}
      self._start()
    self._request_id += 1
    try:
      self._proc.stdin.write(json.dumps({**req, "id": self._request_id}).encode() + b"\n")
      self._proc.stdin.flush()
    except (BrokenPipeError, OSError):
      return self._failed("the tool process died")
    deadline = time.monotonic() + self.limits.timeout_s + self.limits.grace_s
    reply = self._read(deadline, self._request_id)
    if reply == "too_large":
      return self._failed("the tool process sent a reply over the size limit (it was killed)")
    if reply == "timeout":
      return self._failed(f"timed out after {self.limits.timeout_s} s (the tool process was "
                          "killed)")
    if reply == "eof":
      return self._failed("the tool process died (it exited, or was killed for exceeding a "
                          "limit)")
    return reply

  def _failed(self, message: str) -> dict:
    self._kill()
    self.restarts += 1
    return {"ok": False, "error": message, "stdout": ""}

  def _read(self, deadline: float, request_id: Optional[int]):
    """The reply to `request_id` (None: the start-up line), or "timeout" / "eof" /
    "too_large". Lines that are not JSON replies to it (written by tool code) are dropped."""
    fd = self._proc.stdout.fileno()
    # A reply holds at most the limited output, result and error, JSON-escaped (×6 at worst).
    max_line = 24 * self.limits.max_output_chars + (1 << 16)
    while True:
      while b"\n" not in self._buf:
        if len(self._buf) > max_line:
          return "too_large"
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
          return "timeout"
        chunk = os.read(fd, 1 << 16)
        if not chunk:
          return "eof"
        self._buf += chunk
      line, self._buf = self._buf.split(b"\n", 1)
      try:
        reply = json.loads(line)
      except ValueError:
        continue
      if isinstance(reply, dict) and reply.get("id") == request_id and "ok" in reply:
        return reply


def _kill_group(pid: int) -> None:
  try:
    os.killpg(pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass


def _cleanup(pid: list, scratch: str) -> None:
  if pid[0] is not None:
    _kill_group(pid[0])
  shutil.rmtree(scratch, ignore_errors=True)


class SandboxTool:
  """A `Tool.fn` that calls `target` in namespace `ns` of a sandbox."""

  def __init__(self, sandbox: Sandbox, ns: str, target: str):
    self.sandbox, self.ns, self.target = sandbox, ns, target

  def __call__(self, /, **arguments) -> Any:  # positional-only: an argument may be "self"
    return self.sandbox.call(self.ns, self.target, arguments)

  def __repr__(self) -> str:
    return f"SandboxTool({self.ns!r}, {self.target!r})"
