"""The sandbox worker: runs dataset-supplied tool code in its own process (see `sandbox.py`).

Started by `Sandbox` as `python -I -B _sandbox_worker.py CONFIG_JSON`, possibly under
`unshare --net`. It imports nothing from tirjax (so it starts fast and cheap) and speaks
newline-delimited JSON on its original stdin/stdout:

  {"op": "exec", "ns": str, "code": str, "variables": {...}}  run code in namespace `ns`
  {"op": "call", "ns": str, "target": "f" | "obj.method", "arguments": {...}}
  {"op": "drop", "ns": str}
  -> {"ok": true, "result": <JSON>, "stdout": str} | {"ok": false, "error": str, "stdout": str}

Before reading the first request it lowers its resource limits and installs an audit hook
(PEP 578; a hook cannot be removed once added) that refuses network, process creation,
threads, native code loading, limit changes and writes outside the scratch folder.
"""

import contextlib
import io
import json
import os
import resource
import signal
import sys

_NETWORK = ("socket.", "urllib.Request", "http.client.", "ftplib.", "smtplib.", "imaplib.",
            "nntplib.", "poplib.", "telnetlib.", "webbrowser.")
_PROCESS = ("os.system", "os.exec", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn",
            "os.kill", "os.killpg", "subprocess.", "pty.spawn", "os.startfile",
            "signal.pthread_kill", "ctypes.", "resource.setrlimit",
            "resource.prlimit", "sys.remote_exec")
# Events that write to a path, and the positions of their path arguments to check. A copy or a
# symlink only writes its destination; a hard link to an outside file could be written through.
_ONE, _TWO, _DST = (0,), (0, 1), (1,)
_PATH_WRITES = {"os.remove": _ONE, "os.rmdir": _ONE, "os.mkdir": _ONE, "os.chmod": _ONE,
                "os.chown": _ONE, "os.utime": _ONE, "os.truncate": _ONE, "os.setxattr": _ONE,
                "os.removexattr": _ONE, "os.chflags": _ONE, "os.lchflags": _ONE,
                "os.lchmod": _ONE, "shutil.rmtree": _ONE, "shutil.chown": _ONE,
                "os.rename": _TWO, "shutil.move": _TWO, "os.link": _TWO, "os.symlink": _DST,
                "shutil.copyfile": _DST, "shutil.copytree": _DST}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


class SoftTimeout(BaseException):
  """Raised in the tool by the interval timer; BaseException so `except Exception` misses it."""


def _within(path, scratch: str) -> bool:
  if isinstance(path, int):
    return True  # an already-open descriptor
  real = os.path.realpath(os.fsdecode(path))
  return real == scratch or real.startswith(scratch + os.sep)


def install_audit_hook(scratch: str) -> None:
  busy = []  # re-entrancy guard: realpath itself must not re-enter the checks

  def hook(event, args):
    if busy:
      return
    busy.append(1)
    try:
      if event.startswith(_NETWORK):
        raise PermissionError(f"sandbox: network access is not allowed ({event})")
      if event.startswith(_PROCESS):
        raise PermissionError(f"sandbox: {event} is not allowed (no processes, threads, "
                              "native code or limit changes)")
      if event == "open" and len(args) >= 3:
        path, mode, flags = args[0], args[1], args[2]
        writes = (isinstance(flags, int) and flags & _WRITE_FLAGS) or (
            isinstance(mode, str) and any(c in mode for c in "wax+"))
        if writes and path is not None and not _within(path, scratch):
          raise PermissionError(f"sandbox: writing {os.fsdecode(path)!r} is not allowed; "
                                f"only files under the scratch folder {scratch} may be written")
      for i in _PATH_WRITES.get(event, ()):
        path = args[i] if i < len(args) else None
        if isinstance(path, (str, bytes, os.PathLike)) and not _within(path, scratch):
          raise PermissionError(f"sandbox: {event} on {os.fsdecode(path)!r} is not allowed "
                                "outside the scratch folder")
    finally:
      busy.pop()

  sys.addaudithook(hook)


def _no_threads(*args, **kwargs):
  raise PermissionError("sandbox: starting threads is not allowed")


def forbid_threads() -> None:
  """Python 3.11 raises no audit event for new threads, so the entry points are replaced."""
  import _thread
  import threading
  _thread.start_new_thread = _thread.start_new = _no_threads
  threading._start_new_thread = _no_threads


def apply_limits(cfg: dict) -> None:
  mem = int(cfg["memory_bytes"])
  resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
  fsize = int(cfg["max_file_bytes"])
  resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
  resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
  # Not enforced by the kernel for root; the audit hook refuses process creation regardless.
  resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))


def _on_alarm(signum, frame):
  raise SoftTimeout()


def _jsonable(value, max_chars: int):
  """The value itself if it is JSON (no NaN), else its str(); refuses oversized outputs."""
  try:
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
  except (TypeError, ValueError, RecursionError):
    value = str(value)
    text = json.dumps(value, ensure_ascii=False)
  if len(text) > max_chars:
    raise ValueError(f"tool output too large: {len(text)} characters (limit {max_chars})")
  return value


class Worker:

  def __init__(self, cfg: dict):
    self.cfg = cfg
    self.spaces: dict[str, dict] = {}

  def handle(self, req: dict) -> dict:
    op = req.get("op")
    if op == "drop":
      self.spaces.pop(req["ns"], None)
      return {"ok": True, "result": None, "stdout": ""}
    out = io.StringIO()
    try:
      signal.setitimer(signal.ITIMER_REAL, float(self.cfg["timeout_s"]))
      with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        if op == "exec":
          space = self.spaces.setdefault(req["ns"], {"__name__": "__sandbox__"})
          space.update(req.get("variables") or {})
          exec(compile(req["code"], f"<{req['ns']}>", "exec"), space)
          result = None
        elif op == "call":
          result = self._call(req)
        else:
          raise ValueError(f"unknown op {op!r}")
        result = _jsonable(result, int(self.cfg["max_output_chars"]))
      signal.setitimer(signal.ITIMER_REAL, 0)
      return {"ok": True, "result": result, "stdout": self._stdout(out)}
    except SoftTimeout:
      signal.setitimer(signal.ITIMER_REAL, 0)
      return {"ok": False, "error": f"timed out after {self.cfg['timeout_s']} s",
              "stdout": self._stdout(out)}
    except MemoryError:
      signal.setitimer(signal.ITIMER_REAL, 0)
      return {"ok": False, "error": "memory limit exceeded "
              f"({int(self.cfg['memory_bytes']) >> 20} MiB)", "stdout": ""}
    except BaseException as e:  # noqa: BLE001 - the tool's failure is the reply
      signal.setitimer(signal.ITIMER_REAL, 0)
      return {"ok": False, "error": f"{type(e).__name__}: {e}", "stdout": self._stdout(out)}

  def _call(self, req: dict):
    space = self.spaces.get(req["ns"])
    if space is None:
      raise NameError(f"namespace {req['ns']!r} is not defined")
    head, *rest = req["target"].split(".")
    if head not in space:
      raise NameError(f"{head!r} is not defined by the tool code")
    fn = space[head]
    for attr in rest:
      fn = getattr(fn, attr)
    return fn(**req.get("arguments", {}))

  def _stdout(self, out: io.StringIO) -> str:
    text = out.getvalue()
    limit = int(self.cfg["max_output_chars"])
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more]"


def main() -> None:
  cfg = json.loads(sys.argv[1])
  # Keep private copies of the protocol pipes; fds 0 and 1 then point at /dev/null so that
  # C-level writes of tool code cannot corrupt the protocol.
  requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
  replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
  null = os.open(os.devnull, os.O_RDWR)
  os.dup2(null, 0)
  os.dup2(null, 1)
  scratch = os.path.realpath(cfg["scratch"])
  os.chdir(scratch)
  os.environ.update(HOME=scratch, TMPDIR=scratch)
  apply_limits(cfg)
  import ctypes  # noqa: F401 - imported before the hook: modules that import it still load
  forbid_threads()
  signal.signal(signal.SIGALRM, _on_alarm)
  install_audit_hook(scratch)
  worker = Worker(cfg)
  replies.write(json.dumps({"ok": True, "result": "ready", "stdout": ""}) + "\n")
  replies.flush()
  for line in requests:
    reply = worker.handle(json.loads(line))
    replies.write(json.dumps(reply) + "\n")
    replies.flush()


if __name__ == "__main__":
  main()
