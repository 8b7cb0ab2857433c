"""What the sandbox tests read off the machine (whether libseccomp loads here, a process's CPU
time, a worker's pid, system call numbers) and the tool code they share (`HOOK_OFF`)."""


def libseccomp_loads() -> bool:
  """Whether libseccomp.so.2 loads on this machine (the sandbox's seccomp layer needs it)."""
  import ctypes
  try:
    ctypes.CDLL("libseccomp.so.2")
    return True
  except OSError:
    return False


def cpu_ticks(pid):
  """The user CPU time of process `pid` so far, in clock ticks (/proc/<pid>/stat's utime)."""
  with open(f"/proc/{pid}/stat") as f:
    return int(f.read().rsplit(")", 1)[1].split()[11])  # utime


# Tool code that switches the audit hook off in its own worker (the hook's re-entrancy guard,
# found through gc): what a test runs first to show that a kernel or owner layer holds alone.
HOOK_OFF = '''
def hook_off():
    import gc
    for fn in gc.get_objects():
        code = getattr(fn, "__code__", None)
        if code is not None and fn.__name__ == "hook" and "busy" in code.co_freevars:
            fn.__closure__[code.co_freevars.index("busy")].cell_contents.append(1)
            return True
    return False
'''


def worker_pid(sandbox, ns: str) -> int:
  """The pid of namespace `ns`'s worker, as its owner's pidfd shows it."""
  with open(f"/proc/self/fdinfo/{sandbox._workers[ns].pidfd}") as f:
    return int(next(line for line in f if line.startswith("Pid:")).split()[1])


def alive(pid: int) -> bool:
  """Whether process `pid` exists and is not a zombie."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except OSError:
    return False


def syscall_numbers(names) -> dict:
  """{name: number} of the system calls this architecture has, as libseccomp names them."""
  from tirjax.env import _sandbox_kernel as kernel
  lib = kernel.load_libseccomp()
  numbers = {n: lib.seccomp_syscall_resolve_name(n.encode()) for n in names}
  return {n: nr for n, nr in numbers.items() if nr >= 0}
