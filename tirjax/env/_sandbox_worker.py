"""The sandbox's processes: a zygote, and a worker per namespace forked from it (see
`sandbox.py`).

`Sandbox` starts the zygote as `python -I -B _sandbox_worker.py CONFIG_JSON` with an empty
environment. Where the machine permits it, the zygote enters a user namespace of its own
(the owner writes its id maps: root to the owner's own id and, for an owner that is root, the
unprivileged id the workers run as), then network, IPC, PID and mount namespaces; it makes its
view of the filesystem read-only with a private tmpfs over the scratch root
(`_sandbox_kernel.contain`), and then forks a worker for each request on its control socket
(a Unix socket that carries the worker's two pipes in, and a pidfd of the worker out). It
imports nothing from tirjax (so it starts fast and cheap) and runs no tool code; it may import
installed packages' modules that the owner names (`Sandbox.preload`), which its workers then
share.

Each worker serves one namespace, so no tool shares an interpreter, a reply pipe or an audit
hook with another. Before any tool code runs it gets its own PID, mount, network and IPC
namespaces (it is their first process: it sees no other process), its own /proc and a
size-limited tmpfs as its scratch folder, the only writable mount it sees; it clears its
environment, lowers its resource limits, becomes an unprivileged user with no capabilities
and no_new_privs, installs a seccomp filter that refuses new processes and threads (it never
starts one), signals, ptrace, mounts, namespaces, memfd and IPC objects, sockets, larger
pipes, io_uring, userfaultfd, the keyrings, inotify, perf events and bpf (`_sandbox_kernel`),
and then the audit hook (PEP 578: friendly errors for network, processes, threads, native
code, limit changes and writes outside the scratch folder; a first layer, not the
boundary). It speaks newline-delimited JSON on its own
pipes, one reply per request (`_sandbox_wire`):

  {"op": "exec", "ns": str, "code": str, "variables": {...}}  run code in namespace `ns`
  {"op": "call", "ns": str, "target": "f" | "obj.method", "arguments": {...}}
  -> {"ok": true, "result": <JSON>, "stdout": str} | {"ok": false, "error": str, "stdout": str}

Every request carries an `id` that its reply echoes; the owner checks each line before it
trusts it and kills a worker whose line is not the reply to the request in flight. Its first
line reports the layers in force ("enforced").
"""

import builtins
import contextlib
import io
import json
import os
import resource
import signal
import socket
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


def install_audit_hook(scratch: str) -> None:
  """The hook reads only its own closure (bound here, once): tool code that rebinds this
  module's globals or the builtins it uses does not change what it checks."""
  network, process, path_writes, write_flags = _NETWORK, _PROCESS, dict(_PATH_WRITES), _WRITE_FLAGS
  realpath, fsdecode, sep = os.path.realpath, os.fsdecode, os.sep
  is_a, length, text, denied, some = isinstance, len, str, PermissionError, any
  path_types = (str, bytes, os.PathLike)
  busy = []  # re-entrancy guard: realpath itself must not re-enter the checks

  def within(path) -> bool:
    if is_a(path, int):
      return True  # an already-open descriptor
    real = realpath(fsdecode(path))
    return real == scratch or real.startswith(scratch + sep)

  def hook(event, args):
    if busy:
      return
    busy.append(1)
    try:
      if event.startswith(network):
        raise denied(f"sandbox: network access is not allowed ({event})")
      if event.startswith(process):
        raise denied(f"sandbox: {event} is not allowed (no processes, threads, native code or "
                     "limit changes)")
      if event == "object.__setattr__" and length(args) >= 2 and args[0] in guarded:
        raise denied("sandbox: changing the sandbox's own functions is not allowed")
      if event == "open" and length(args) >= 3:
        path, mode, flags = args[0], args[1], args[2]
        writes = (is_a(flags, int) and flags & write_flags) or (
            is_a(mode, text) and some(c in mode for c in "wax+"))
        if writes and path is not None and not within(path):
          raise denied(f"sandbox: writing {fsdecode(path)!r} is not allowed; only files under "
                       f"the scratch folder {scratch} may be written")
      for i in path_writes.get(event, ()):
        path = args[i] if i < length(args) else None
        if is_a(path, path_types) and not within(path):
          raise denied(f"sandbox: {event} on {fsdecode(path)!r} is not allowed outside the "
                       "scratch folder")
    finally:
      busy.pop()

  guarded = (hook, within)
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
  # No new process for the worker's user (seccomp refuses them already; the kernel does not
  # apply this limit to root, which a worker never is).
  resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
  # Open files, and with them pipes: each holds at most 64 KiB of kernel memory (seccomp
  # refuses F_SETPIPE_SZ), which RLIMIT_AS does not count.
  files = int(cfg["max_open_files"])
  resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))


def _on_alarm(signum, frame):
  raise SoftTimeout()


def _jsonable(value, max_chars: int):
  """The value itself if it is JSON (no NaN), else its str(); refuses oversized outputs and
  ones nested deeper than the owner accepts."""
  try:
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
  except (TypeError, ValueError, RecursionError):
    value = str(value)
    text = json.dumps(value, ensure_ascii=False)
  if len(text) > max_chars:
    raise ValueError(f"tool output too large: {len(text)} characters (limit {max_chars})")
  if wire.deeper_than(text.encode("utf-8", "surrogatepass"), wire.MAX_DEPTH):
    raise ValueError(f"tool output nests deeper than {wire.MAX_DEPTH} lists and objects")
  return value


class Worker:

  def __init__(self, cfg: dict):
    self.cfg = cfg
    self.spaces: dict[str, dict] = {}
    self.limit = int(cfg["max_output_chars"])
    self._live_builtins = builtins.__dict__
    self._builtins = dict(builtins.__dict__)  # pristine, restored after every request

  def handle(self, req: dict) -> dict:
    reply = self._handle(req)
    reply["id"] = req.get("id")
    if not reply["ok"]:
      reply["error"] = wire.held_to(reply["error"], self.limit)
    self._restore_builtins()  # again: the result's __str__ is tool code too
    return reply

  def _restore_builtins(self) -> None:
    """Undoes any change tool code made to the shared `builtins` module (each namespace has
    its own copy as __builtins__; this covers `import builtins; builtins.len = ...`)."""
    self._live_builtins.clear()
    self._live_builtins.update(self._builtins)

  def _run_tool(self, req: dict, op: str):
    try:
      if op == "exec":
        space = self.spaces.setdefault(req["ns"], {"__name__": "__sandbox__",
                                                   "__builtins__": dict(self._builtins)})
        space.update(req.get("variables") or {})
        exec(compile(req["code"], f"<{req['ns']}>", "exec"), space)
        return None
      if op == "call":
        return self._call(req)
      raise ValueError(f"unknown op {op!r}")
    finally:
      self._restore_builtins()

  def _handle(self, req: dict) -> dict:
    op = req.get("op")
    out = io.StringIO()
    try:
      signal.setitimer(signal.ITIMER_REAL, float(self.cfg["timeout_s"]))
      with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        result = _jsonable(self._run_tool(req, op), self.limit)
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
      return {"ok": False, "error": f"{type(e).__name__}: {_limited_str(e, self.limit)}",
              "stdout": self._stdout(out)}

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
    return wire.held_to(out.getvalue(), self.limit)


def _limited_str(error: BaseException, limit: int) -> str:
  """str(error), cut to `limit` characters (a tool's error is limited like its output)."""
  try:
    text = str(error)
  except BaseException:  # noqa: BLE001 - a hostile __str__
    return "<error message could not be read>"
  return wire.held_to(text, limit)


def _load(name: str):
  """`name`.py from this file's folder, loaded by path (tool code's sys.path gains
  nothing)."""
  import importlib.util
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


wire = _load("_sandbox_wire")


def _threads_refused() -> bool:
  """Whether the kernel refuses a new thread (asked before the Python guard replaces
  `start_new_thread`, so that the answer is the kernel's)."""
  import _thread
  try:
    _thread.start_new_thread(int, ())
  except RuntimeError:
    return True
  return False


def _close_fds_but(keep) -> None:
  """Closes every descriptor from 3 up except `keep` (the zygote's control socket and the
  pipes of other workers are never a worker's to use)."""
  low = 3
  for fd in sorted(keep):
    os.closerange(low, fd)
    low = fd + 1
  os.closerange(low, os.sysconf("SC_OPEN_MAX"))


def _ids(cfg: dict):
  return None if cfg.get("worker_ids") is None else tuple(cfg["worker_ids"])


def run_worker(cfg: dict, kernel, fds: list, scratch: str, contained: bool,
               zygote: int) -> None:
  """The worker, in a child of the zygote: it sets up its layers, innermost last, then
  answers requests on its own pipes until its owner closes them or kills it. Never returns."""
  try:
    os.setsid()  # kill(0, ...) reaches only its own process group
    _close_fds_but(fds)
    requests = os.fdopen(fds[0], "r", encoding="utf-8")
    replies = os.fdopen(fds[1], "w", encoding="utf-8")
    enforced = {"pid_namespace": False, "scratch_quota": False, "writable_mounts_noexec": False}
    if contained:
      enforced.update(kernel.isolate(scratch, int(cfg["scratch_bytes"]), _ids(cfg)))
    elif not kernel.die_with_parent(signal.SIGKILL) or os.getppid() != zygote:
      return  # the zygote is already gone, or the worker could not be tied to it
    os.chdir(scratch)
    # Nothing of the owner's environment (API keys, tokens) reaches tool code.
    os.environ.clear()
    os.environ.update(HOME=scratch, TMPDIR=scratch, PATH="/usr/bin:/bin")
    apply_limits(cfg)
    enforced["capabilities_dropped"] = kernel.drop_privileges(_ids(cfg))
    enforced["seccomp"] = kernel.refuse_syscalls()
    enforced["threads_refused"] = _threads_refused()
    forbid_threads()
    signal.signal(signal.SIGALRM, _on_alarm)
    install_audit_hook(scratch)
    worker = Worker(cfg)
    replies.write(json.dumps({"ok": True, "result": "ready", "stdout": "", "id": None,
                              "enforced": enforced}) + "\n")
    replies.flush()
    for line in requests:
      reply = worker.handle(json.loads(line))
      replies.write(json.dumps(reply) + "\n")
      replies.flush()
  finally:
    os._exit(0)


def _answer(control, reply: dict, pidfd=None) -> None:
  """One answer on the control socket (with the worker's pidfd, which it then closes)."""
  socket.send_fds(control, [json.dumps(reply).encode()], [] if pidfd is None else [pidfd])
  if pidfd is not None:
    os.close(pidfd)


def spawn(control, cfg: dict, kernel, fds: list, scratch: str, contained: bool) -> None:
  """Forks a worker for one namespace and answers the owner with its pidfd (a handle that
  reaches it across PID namespaces). Its mount point `scratch` is made here (named by the
  owner, unpredictably; a name that exists is an error). Contained, a short-lived child makes
  the new namespaces and forks the worker as their first process, then answers and exits."""
  zygote, name = os.getpid(), os.path.basename(scratch)  # the name tells answers apart
  try:
    os.mkdir(scratch, 0o700)
    if _ids(cfg) is not None:
      os.chown(scratch, *_ids(cfg))
    if not contained:
      pid = os.fork()
      if pid == 0:
        run_worker(cfg, kernel, fds, scratch, False, zygote)
      _answer(control, {"ok": True, "request": name}, os.pidfd_open(pid))
    elif os.fork() == 0:
      try:
        if not kernel.new_namespaces():
          _answer(control, {"ok": False, "request": name,
                            "error": "no new PID, mount, network and IPC namespaces"})
        else:
          signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # its pid stays valid until opened
          pid = os.fork()
          if pid == 0:
            run_worker(cfg, kernel, fds, scratch, True, zygote)
          _answer(control, {"ok": True, "request": name}, os.pidfd_open(pid))
      finally:
        os._exit(0)
  except OSError as e:
    _answer(control, {"ok": False, "request": name, "error": f"{type(e).__name__}: {e}"})
  finally:
    for fd in fds:
      os.close(fd)


def preload(modules: list) -> dict:
  """Imports installed packages' modules (trusted code, the owner's choice) in the zygote, so
  that every worker forked later starts with them; returns {module: error} of those that
  failed."""
  import importlib
  errors = {}
  for name in modules:
    try:
      importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - reported; a worker that needs it fails there
      errors[name] = f"{type(e).__name__}: {e}"
  return errors


def _interpreter_paths(root: str) -> list:
  """What a worker reads after it dropped its privileges: the interpreter's library and
  packages (imports made by tool code), and the scratch root."""
  return [root, sys.prefix, sys.base_prefix, *(p for p in sys.path if os.path.isdir(p))]


def enter_namespaces(control, kernel, contained: bool) -> None:
  """The zygote's user namespace (its id maps written by the owner, asked for on the control
  socket), then its network, IPC and, `contained`, PID and mount namespaces. Contained, the
  process forks: its child, the first process of the new PID namespace, goes on as the
  zygote (its workers die with it), and this one waits for it and exits with it."""
  if not kernel.new_user_namespace():
    _answer(control, {"ok": False, "request": "map", "error": "no user namespace"})
    os._exit(1)
  _answer(control, {"ok": True, "request": "map"})
  if control.recv(64) != b"mapped" or not kernel.zygote_namespaces(contained):
    os._exit(1)
  if contained:
    child = os.fork()
    if child:
      control.close()
      _, status = os.waitpid(child, 0)
      os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    kernel.die_with_parent(signal.SIGKILL)


def main() -> None:
  """The zygote: prepared once (namespaces, imports, read-only view, libseccomp), it forks a
  worker per request on its control socket. It runs no tool code. When the owner's end of
  the socket closes (the owner closed the sandbox or died, even by SIGKILL) it exits, and its
  workers die with it: as the PID namespace's init (their tmpfs folders and its own go with
  their mount namespaces), or by the parent-death signal outside one."""
  cfg = json.loads(sys.argv[1])
  control = socket.socket(fileno=int(cfg.pop("control")))
  kernel = _load("_sandbox_kernel")
  root = os.path.realpath(cfg["scratch"])
  contained = cfg["mode"] == "contained"
  if cfg["mode"] != "none":
    enter_namespaces(control, kernel, contained)
  exposed = _interpreter_paths(root) if _ids(cfg) is not None else []
  enforced = {"readonly_filesystem": contained and kernel.contain(root, exposed)}
  if exposed and not contained:  # the interpreter's folders, where root can unshare a view
    kernel.private_view(exposed)
  kernel.load_libseccomp()  # once, here: each worker installs its own filter from it
  signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # exited workers are reaped by the kernel
  _answer(control, {"ok": True, "enforced": enforced})
  while True:
    try:
      message, fds, _, _ = socket.recv_fds(control, 1 << 16, 2)
    except OSError:
      break
    if not message:
      break
    request = json.loads(message)
    scratch = os.path.join(root, os.path.basename(request["request"]))
    if request["op"] == "import":
      _answer(control, {"ok": True, "request": request["request"],
                        "errors": preload(request["modules"])})
    elif request["op"] == "remove":  # a dead worker's (empty) mount point
      with contextlib.suppress(OSError):
        os.rmdir(scratch)
    else:
      spawn(control, cfg, kernel, fds, scratch, contained)
  os._exit(0)


if __name__ == "__main__":
  main()
