"""The owner's side of the sandbox's processes (`sandbox.py` uses it): what the machine
permits, the zygote, and one worker per namespace with its own pipes.

The zygote (`_sandbox_worker.py`) is started once per `Sandbox`, with an empty environment;
where user namespaces exist it enters one and asks the owner to write its id maps (only a
process outside the namespace may map more than its own id). A worker is asked of it over a
Unix socket: the owner sends the worker's ends of two fresh pipes and gets back a pidfd,
through which it kills the worker (a pidfd reaches a process in another PID namespace, and
never a recycled pid).

The owner never waits on a worker without a deadline: its ends of the pipes are non-blocking,
a request is written and its reply read by the call's deadline, and a worker that stops
reading, or sends anything but the checked reply to the request in flight
(`_sandbox_wire.check_reply`), is killed.
"""

from __future__ import annotations

import json
import math
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Optional, Union

from tirjax.env import _sandbox_files as files
from tirjax.env import _sandbox_wire as wire
from tirjax.env.tools import ToolError

_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_worker.py")
NOBODY = 65534  # the uid and gid workers run as when the owner is root
# The `unshare` flags that probe each mode (the zygote makes the namespaces itself).
MODES = {"contained": ["--map-root-user", "--net", "--ipc", "--pid", "--fork", "--kill-child",
                       "--mount", "--mount-proc"],
         "network": ["--map-root-user", "--net", "--ipc"]}
START_S = 30.0  # the most a zygote or a worker may take to come up on a loaded machine
# The zygote's environment: nothing of the owner's (API keys, tokens) reaches tool code.
ENVIRONMENT = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}

_PROBED: dict[str, bool] = {}


def unshare_works(mode: str) -> bool:
  """Whether this user can make the namespaces of `mode` here (probed once per process)."""
  if mode not in _PROBED:
    exe = shutil.which("unshare")
    try:
      _PROBED[mode] = exe is not None and subprocess.run(
          [exe, *MODES[mode], "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
      _PROBED[mode] = False
  return _PROBED[mode]


def worker_ids() -> Optional[list]:
  """The uid and gid workers drop to: nobody's when the owner is root; None otherwise (they
  keep the owner's own, unprivileged, ids)."""
  return [NOBODY, NOBODY] if os.geteuid() == 0 else None


def write_id_maps(pid: int) -> None:
  """The id maps of process `pid`'s new user namespace: root inside is the owner, and, for an
  owner that is root, nobody inside is nobody outside (the workers' ids)."""
  if os.geteuid() == 0:
    both = f"0 0 1\n{NOBODY} {NOBODY} 1\n"
    maps = [("uid_map", both), ("gid_map", both)]
  else:
    maps = [("setgroups", "deny"), ("uid_map", f"0 {os.geteuid()} 1\n"),
            ("gid_map", f"0 {os.getegid()} 1\n")]
  for name, text in maps:
    with open(f"/proc/{pid}/{name}", "w") as f:
      f.write(text)


def kill_group(pid: int) -> None:
  try:
    os.killpg(pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass


def _wait(fd: int, deadline: float, write: bool = False) -> bool:
  """Whether `fd` is ready to read (or `write`), or closed at its other end, by `deadline`.
  poll, not select: select refuses descriptors from 1024 up (ValueError), which an owner
  holding many open files hands to its workers' pipes."""
  left = deadline - time.monotonic()
  if left <= 0:
    return False
  poller = select.poll()
  poller.register(fd, select.POLLOUT if write else select.POLLIN)
  return bool(poller.poll(math.ceil(left * 1000)))


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


def inspect(pidfd: int) -> dict:
  """What the owner itself reads of a worker's process, which no tool code can forge: that it
  runs as no root id and with no_new_privs, and in an IPC namespace not the owner's."""
  try:
    with open(f"/proc/self/fdinfo/{pidfd}") as f:
      pid = next(int(line.split()[1]) for line in f if line.startswith("Pid:"))
    with open(f"/proc/{pid}/status") as f:
      status = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    ipc = os.readlink(f"/proc/{pid}/ns/ipc") != os.readlink("/proc/self/ns/ipc")
  except (OSError, StopIteration, ValueError):
    return {"unprivileged_user": False, "no_new_privs": False, "ipc_namespace": False}
  ids = status["Uid"].split() + status["Gid"].split() + status["Groups"].split()
  return {"unprivileged_user": "0" not in ids, "no_new_privs": status["NoNewPrivs"] == "1",
          "ipc_namespace": ipc}


class WorkerProcess:
  """One namespace's worker: its request and reply pipes (non-blocking on the owner's side),
  and a pidfd to kill it by.

  Between requests the worker is stopped (SIGSTOP, which no handler can catch): tool code can
  leave nothing running after its call returns, not even a signal handler armed by a timer, so
  a worker uses CPU only while the owner waits for its reply, bounded by the time-out."""

  def __init__(self, pidfd: int, requests: int, replies: int, name: str, max_line: int):
    self.pidfd, self.name, self._max_line = pidfd, name, max_line
    self._requests, self._replies = requests, replies
    for fd in (requests, replies):
      os.set_blocking(fd, False)
    self._buf = b""

  def send(self, request: dict, deadline: float) -> Optional[str]:
    """Drops what the stopped worker wrote since its last reply, resumes it and writes one
    request line by `deadline`: None once written, else "timeout" (it stopped reading) or
    "eof" (it is gone)."""
    data = memoryview(json.dumps(request).encode() + b"\n")
    self._drain()
    _signal(self.pidfd, signal.SIGCONT)
    while data:
      try:
        data = data[os.write(self._requests, data):]
      except BlockingIOError:  # the pipe is full: wait until the worker reads, or give up
        if not _wait(self._requests, deadline, write=True):
          return "timeout"
      except OSError:
        return "eof"
    return None

  def _drain(self) -> None:
    """Drops whatever the worker wrote beyond its last reply, so that the next line read is
    its reply to the next request: a line it wrote ahead for a later id (issue 56) never
    answers that request. The worker is stopped (SIGSTOP, which it cannot catch, since its
    last reply): what there is to drop is at most one pipe's capacity."""
    self._buf = b""
    while True:
      try:
        if not os.read(self._replies, 1 << 16):
          return  # it is gone: the read that follows reports it
      except OSError:  # BlockingIOError: nothing (more) there
        return

  def read(self, deadline: float, request_id: Optional[int]) -> Union[dict, str]:
    """The checked reply to `request_id` (None: the start-up line), or "timeout" / "eof" /
    "too_large"; raises `wire.ReplyError` for a line that is not that reply. The worker is
    stopped again as soon as its line is complete."""
    while b"\n" not in self._buf:
      if len(self._buf) > self._max_line:
        return "too_large"
      if not _wait(self._replies, deadline):
        return "timeout"
      try:
        chunk = os.read(self._replies, 1 << 16)
      except BlockingIOError:
        continue
      if not chunk:
        return "eof"
      self._buf += chunk
    _signal(self.pidfd, signal.SIGSTOP)  # until the next request
    line, self._buf = self._buf.split(b"\n", 1)
    return wire.check_reply(line, request_id, self._max_line)

  def kill(self) -> None:
    """SIGKILL, then waits (briefly) until it is gone."""
    if _kill(self.pidfd):
      _wait(self.pidfd, time.monotonic() + 5.0)  # readable once it has exited
    for fd in (self.pidfd, self._requests, self._replies):
      os.close(fd)


class Zygote:
  """The process that forks the workers, started on first use."""

  def __init__(self, root: str, cfg: dict, mode: str, max_line: int):
    self.root, self.cfg, self.mode, self.max_line = root, cfg, mode, max_line
    self.proc: Optional[subprocess.Popen] = None
    self._sock: Optional[socket.socket] = None
    self._imports = 0

  def start(self) -> dict:
    """Starts the zygote; returns the layers it reports."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    cfg = dict(self.cfg, scratch=self.root, control=theirs.fileno(), mode=self.mode,
               worker_ids=worker_ids())
    try:
      self.proc = subprocess.Popen(
          [sys.executable, "-I", "-B", _WORKER, json.dumps(cfg)], stdin=subprocess.DEVNULL,
          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
          cwd="/", env=ENVIRONMENT, pass_fds=(theirs.fileno(),))
    finally:
      theirs.close()
    self._sock = ours
    deadline = time.monotonic() + START_S
    if self.mode != "none":
      asked, _ = self._receive(deadline, "map")
      try:
        if not (asked or {}).get("ok"):
          raise OSError((asked or {}).get("error", "no answer"))
        write_id_maps(self.proc.pid)
        self._sock.send(b"mapped")
      except OSError as e:
        self.close()
        raise ToolError(f"the sandbox's zygote could not enter its namespaces ({e})") from None
    ready, _ = self._receive(deadline, None)
    if not (ready or {}).get("ok"):
      self.close()
      raise ToolError("the sandbox's zygote process failed to start")
    return ready["enforced"]

  def spawn(self, deadline: Optional[float] = None) -> tuple[WorkerProcess, dict]:
    """A new worker with a scratch folder of its own, and the layers it reports, by
    `deadline` (a call's budget) or within START_S."""
    deadline = min(time.monotonic() + START_S, deadline or float("inf"))
    name = files.new_name()
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
      why = (answer or {}).get("error", "the zygote did not answer")
      raise ToolError(f"the sandbox worker failed to start ({why})")
    worker = WorkerProcess(fds[0], requests_w, replies_r, name, self.max_line)
    try:
      ready = worker.read(deadline, None)
    except wire.ReplyError as e:
      ready = str(e)
    if not isinstance(ready, dict):
      self.remove(worker)
      raise ToolError(f"the sandbox worker failed to start ({ready})")
    return worker, {**ready["enforced"], **inspect(worker.pidfd)}

  def remove(self, worker: WorkerProcess) -> None:
    """Kills `worker` and removes its scratch folder: a tree on the host's disk without
    namespaces; else the zygote's empty mount point (its tmpfs went with the worker)."""
    worker.kill()
    if self.mode != "contained":
      try:
        files.remove_tree(os.path.join(self.root, worker.name))
      except OSError:
        pass  # what is left goes with the scratch root
    elif self._sock is not None:
      try:
        self._sock.send(json.dumps({"op": "remove", "request": worker.name}).encode())
      except OSError:
        pass  # the zygote is gone, and its tmpfs with it

  def preload(self, modules: list[str]) -> dict:
    """Has the zygote import `modules`; returns {module: error} of those that failed."""
    self._imports += 1
    name = f"import-{self._imports}"
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
    while _wait(self._sock.fileno(), deadline):
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
