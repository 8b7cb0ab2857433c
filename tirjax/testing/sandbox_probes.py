"""What the sandbox tests read off the machine: whether libseccomp loads here, and a process's
CPU time."""


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
