"""The owner's side of the sandbox's processes (`sandbox.py` uses it): what the machine
permits, the zygote, and one worker per namespace with its own pipes.

The zygote (`_sandbox_worker.py`) is started once per `Sandbox`, under `unshare` where user
namespaces exist. A worker is asked of it over a Unix socket: the owner sends the worker's
ends of two fresh pipes and gets back a pidfd, through which it kills the worker (a pidfd
reaches a process in another PID namespace, and never a recycled pid).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Optional, Union

from tirjax.env.tools import ToolError

_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_worker.py")
NOBODY = 65534
NET_ONLY = ["--map-root-user", "--net"]
CONTAINED = NET_ONLY + ["--pid", "--fork", "--kill-child", "--mount", "--mount-proc"]
SCRATCH_PREFIX = "tirjax-sandbox-"
START_S = 30.0  # the most a zygote or a worker may take to come up on a loaded machine

_PROBED: dict[str, bool] = {}
_NOBODY_RUNS_PYTHON: list = []


def as_user() -> dict:
  """Popen arguments that drop root to nobody; nothing when not root, or when nobody cannot
  run this interpreter (e.g. one installed under a private /root)."""
  if os.geteuid() != 0:
    return {}
  drop = dict(user=NOBODY, group=NOBODY, extra_groups=[])
  if not _NOBODY_RUNS_PYTHON:
    try:
      runs = subprocess.run([sys.executable, "-I", "-c", ""], cwd="/", capture_output=True,
                            timeout=30, **drop).returncode == 0
    except (OSError, subprocess.SubprocessError):
      runs = False
    _NOBODY_RUNS_PYTHON.append(runs)
  return drop if _NOBODY_RUNS_PYTHON[0] else {}


def unshare_works(flags: list[str]) -> bool:
  key = " ".join(flags)
  if key not in _PROBED:
    exe = shutil.which("unshare")
    try:
      _PROBED[key] = exe is not None and subprocess.run(
          [exe, *flags, "true"], capture_output=True, timeout=10, **as_user()).returncode == 0
    except (OSError, subprocess.SubprocessError):
      _PROBED[key] = False
  return _PROBED[key]


def remove_orphaned_scratch() -> None:
  """Scratch folders whose owning process is gone (it was killed before it could clean up)."""
  tmp = tempfile.gettempdir()
  for name in os.listdir(tmp):
    if not name.startswith(SCRATCH_PREFIX):
      continue
    owner = name[len(SCRATCH_PREFIX):].split("-", 1)[0]
    if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
      shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)


def kill_group(pid: int) -> None:
  try:
    os.killpg(pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass


def _wait_readable(fd: int, deadline: float) -> bool:
  left = deadline - time.monotonic()
  return left > 0 and bool(select.select([fd], [], [], left)[0])


def _signal(pidfd: int, signum: int) -> bool:
  """`signum` through a pidfd (SIGKILL, SIGSTOP and SIGCONT reach even the init of a PID
  namespace from outside it); False if the process was already gone."""
  try:
    signal.pidfd_send_signal(pidfd, signum)
    return True
  except OSError:
    return False


def _kill(pidfd: int) -> bool:
  return _signal(pidfd, signal.SIGKILL)


class WorkerProcess:
  """One namespace's worker: its request and reply pipes, and a pidfd to kill it by.

  Between requests the worker is stopped (SIGSTOP, which no handler can catch): tool code can
  leave nothing running after its call returns, not even a signal handler armed by a timer, so
  a worker uses CPU only while the owner waits for its reply, bounded by the time-out."""

  def __init__(self, pidfd: int, requests: int, replies: int, scratch: str, max_line: int):
    self.pidfd, self.scratch, self._max_line = pidfd, scratch, max_line
    self._requests, self._replies = requests, replies
    self._buf = b""

  def send(self, request: dict) -> bool:
    """Resumes the worker and writes one request line; False if the worker is gone."""
    data = json.dumps(request).encode() + b"\n"
    _signal(self.pidfd, signal.SIGCONT)
    try:
      while data:
        data = data[os.write(self._requests, data):]
    except OSError:
      return False
    return True

  def read(self, deadline: float, request_id: Optional[int]) -> Union[dict, str]:
    """The reply to `request_id` (None: the start-up line), or "timeout" / "eof" /
    "too_large". Lines that are not JSON replies to it (written by tool code) are dropped."""
    while True:
      while b"\n" not in self._buf:
        if len(self._buf) > self._max_line:
          return "too_large"
        if not _wait_readable(self._replies, deadline):
          return "timeout"
        chunk = os.read(self._replies, 1 << 16)
        if not chunk:
          return "eof"
        self._buf += chunk
      line, self._buf = self._buf.split(b"\n", 1)
      try:
        reply = json.loads(line)
      except ValueError:
        continue
      if isinstance(reply, dict) and reply.get("id") == request_id and "ok" in reply:
        _signal(self.pidfd, signal.SIGSTOP)  # until the next request
        return reply

  def kill(self) -> None:
    """SIGKILL, then waits (briefly) until it is gone and removes its scratch folder."""
    if _kill(self.pidfd):
      _wait_readable(self.pidfd, time.monotonic() + 5.0)  # readable once it has exited
    for fd in (self.pidfd, self._requests, self._replies):
      os.close(fd)
    shutil.rmtree(self.scratch, ignore_errors=True)


class Zygote:
  """The process that forks the workers, started on first use."""

  def __init__(self, root: str, cfg: dict, namespaces: list[str], max_line: int):
    self.root, self.cfg, self.namespaces, self.max_line = root, cfg, namespaces, max_line
    self.proc: Optional[subprocess.Popen] = None
    self._sock: Optional[socket.socket] = None
    self._spawned = 0

  def start(self) -> dict:
    """Starts the zygote; returns the layers it reports."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    cfg = dict(self.cfg, scratch=self.root, control=theirs.fileno(),
               contain=self.namespaces is CONTAINED)
    cmd = [sys.executable, "-I", "-B", _WORKER, json.dumps(cfg)]
    if as_user():
      os.chown(self.root, NOBODY, NOBODY)
    if self.namespaces:
      cmd = [shutil.which("unshare"), *self.namespaces] + cmd
    try:
      self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, start_new_session=True,
                                   cwd=self.root, pass_fds=(theirs.fileno(),), **as_user())
    finally:
      theirs.close()
    self._sock = ours
    ready, _ = self._receive(time.monotonic() + START_S, None)
    if not (ready or {}).get("ok"):
      self.close()
      raise ToolError("the sandbox's zygote process failed to start")
    return ready["enforced"]

  def spawn(self) -> tuple[WorkerProcess, dict]:
    """A new worker with a scratch folder of its own, and the layers it reports."""
    deadline = time.monotonic() + START_S
    self._spawned += 1
    name = str(self._spawned)
    scratch = os.path.join(self.root, name)
    os.makedirs(scratch)
    if as_user():
      os.chown(scratch, NOBODY, NOBODY)
    requests_r, requests_w = os.pipe()
    replies_r, replies_w = os.pipe()
    try:
      socket.send_fds(self._sock, [json.dumps({"op": "spawn", "request": name}).encode()],
                      [requests_r, replies_w])
      answer, fds = self._receive(deadline, name)
    except OSError:
      answer, fds = None, []
    finally:
      os.close(requests_r)
      os.close(replies_w)
    if not (answer or {}).get("ok") or len(fds) != 1:
      for fd in (requests_w, replies_r, *fds):
        os.close(fd)
      shutil.rmtree(scratch, ignore_errors=True)
      why = (answer or {}).get("error", "the zygote did not answer")
      raise ToolError(f"the sandbox worker failed to start ({why})")
    worker = WorkerProcess(fds[0], requests_w, replies_r, scratch, self.max_line)
    ready = worker.read(deadline, None)
    if not isinstance(ready, dict):
      worker.kill()
      raise ToolError(f"the sandbox worker failed to start ({ready})")
    return worker, ready.get("enforced", {})

  def preload(self, modules: list[str]) -> dict:
    """Has the zygote import `modules`; returns {module: error} of those that failed."""
    self._spawned += 1
    name = f"import-{self._spawned}"
    self._sock.send(json.dumps({"op": "import", "request": name,
                                "modules": list(modules)}).encode())
    answer, _ = self._receive(time.monotonic() + START_S, name)
    if answer is None:
      raise ToolError("the sandbox's zygote did not answer an import")
    return answer["errors"]

  def _receive(self, deadline: float, name: Optional[str]) -> tuple[Optional[dict], list]:
    """The zygote's answer about worker `name` (None: its start-up), with the fds it carries;
    (None, []) at the deadline or when the zygote is gone. A late answer about an earlier
    worker (one given up on) is dropped, and that worker killed."""
    while _wait_readable(self._sock.fileno(), deadline):
      message, fds, _, _ = socket.recv_fds(self._sock, 1 << 16, 1)
      if not message:
        break
      answer = json.loads(message)
      if answer.get("request") == name:
        return answer, fds
      for fd in fds:
        _kill(fd)
        os.close(fd)
    return None, []

  @property
  def alive(self) -> bool:
    return self.proc is not None and self.proc.poll() is None

  def close(self) -> None:
    """Closes the control socket (the zygote then exits, its workers with it) and kills the
    zygote's process group in case it does not."""
    if self._sock is not None:
      self._sock.close()
      self._sock = None
    proc, self.proc = self.proc, None
    if proc is not None:
      kill_group(proc.pid)
      proc.wait()
