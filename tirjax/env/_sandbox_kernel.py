"""Kernel containment for the sandbox's processes (`_sandbox_worker.py` loads this file by
path; it imports nothing from tirjax). Everything here acts below Python, so no rebinding,
`gc` walk, `dir_fd` trick or native call of tool code gets around it:

* `contain`: the zygote's read-only view of the filesystem;
* `new_namespaces`: a fresh PID, mount and network namespace for each worker;
* `isolate`: the worker's own /proc and its size-limited tmpfs scratch folder;
* `drop_capabilities`: the capabilities that root of the user namespace would have;
* `refuse_syscalls`: a seccomp filter refusing new processes and threads, other processes,
  mounts and namespaces.

Each returns whether it took effect, so that the sandbox reports a layer that is missing
rather than assuming it.
"""

import ctypes
import os

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_void_p]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                        ctypes.c_ulong]

# <sys/mount.h>
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 32, 1024, 2048, 4096, 16384
MS_RELATIME, MS_STRICTATIME = 1 << 21, 1 << 24
_KEPT_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
               "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME}
# <sched.h>, <sys/prctl.h>
CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x20000000, 0x40000000
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 1, 4, 24
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4


def _mount_points() -> list[tuple[str, int]]:
  """(mount point, its per-mount flags to keep) from /proc/self/mountinfo."""
  out = []
  with open("/proc/self/mountinfo") as f:
    for line in f:
      fields = line.split()
      point = fields[4].encode().decode("unicode_escape")  # "\040" etc. in names
      flags = sum(_KEPT_FLAGS.get(o, 0) for o in fields[5].split(","))
      out.append((point, flags))
  return out


def contain(scratch: str) -> bool:
  """In a new mount namespace (as root of a new user namespace): keeps the scratch folder
  writable through a bind mount of itself and remounts every other mount read-only, so no
  path outside the scratch folder can be written, whatever the call (dir_fd, mkfifo, native
  code). Returns whether the root filesystem ended up read-only."""
  if _libc.mount(scratch.encode(), scratch.encode(), None, MS_BIND | MS_REC, None) != 0:
    return False
  for point, flags in _mount_points():
    if point == scratch or point.startswith(scratch + os.sep):
      continue
    # nodev too: a read-only mount still lets a device node be written. A mount that refuses
    # (one the kernel locked) stays as it is; "/" is checked below.
    _libc.mount(None, point.encode(), None,
                MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NODEV | MS_NOSUID | flags, None)
  return bool(os.statvfs("/").f_flag & os.ST_RDONLY)


def new_namespaces() -> bool:
  """New PID (for the next child), mount and network namespaces: the worker forked next is
  the init of a PID namespace of its own, sees no other worker and shares no loopback."""
  return _libc.unshare(CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET) == 0


def isolate(scratch: str, scratch_bytes: int) -> dict:
  """In the worker's own namespaces: a /proc that shows only its PID namespace, and a tmpfs
  of `scratch_bytes` (and one inode per 4 KiB) over its scratch folder, private to it.
  Returns which of the two is in force ("pid_namespace", "scratch_quota")."""
  proc = _libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) == 0
  options = f"size={scratch_bytes},nr_inodes={max(64, scratch_bytes // 4096)},mode=0700"
  quota = _libc.mount(b"tmpfs", scratch.encode(), b"tmpfs", MS_NOSUID | MS_NODEV,
                      options.encode()) == 0
  if quota:
    fs = os.statvfs(scratch)
    quota = fs.f_blocks * fs.f_frsize <= scratch_bytes
  return {"pid_namespace": proc and os.getpid() == 1, "scratch_quota": quota}


def die_with_parent(signal_number: int) -> bool:
  """Outside a PID namespace: the worker gets `signal_number` when the zygote dies."""
  return _libc.prctl(PR_SET_PDEATHSIG, signal_number, 0, 0, 0) == 0


class _CapHeader(ctypes.Structure):
  _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
  _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
              ("inheritable", ctypes.c_uint32)]


def _capabilities() -> dict:
  with open("/proc/self/status") as f:
    return {k: int(v, 16) for k, v in (line.split(":") for line in f)
            if k in ("CapEff", "CapPrm", "CapAmb")}


def drop_capabilities() -> bool:
  """Empties the bounding, ambient, effective, permitted and inheritable sets (root of a user
  namespace holds every capability in it: mount, ptrace, ...) and makes the process
  non-dumpable (its /proc/PID/mem closed to processes of the same user). Returns whether the
  process holds no capability (the bounding set of an unprivileged user stays full: it only
  limits what an exec could gain, and exec is refused)."""
  _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
  for cap in range(64):
    if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 22:
      break  # EINVAL: past the last capability this kernel knows
  _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
  _libc.capset(ctypes.byref(_CapHeader(0x20080522, 0)), (_CapData * 2)())  # version 3
  return not any(_capabilities().values())


# <seccomp.h>
SCMP_ACT_ALLOW = 0x7FFF0000
EPERM, ENOSYS = 1, 38
# Refused with EPERM once the worker is set up. clone3 passes its flags in memory that a
# filter cannot read, so it is refused with ENOSYS instead: the C library then falls back to
# clone, which is refused outright (with or without CLONE_THREAD: the worker runs no thread).
REFUSED = (
    # new processes and threads
    "fork", "vfork", "clone", "execve", "execveat",
    # other processes (there are none in the worker's PID namespace; without one, its
    # siblings and owner)
    "kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_open",
    "pidfd_send_signal", "pidfd_getfd", "ptrace", "process_vm_readv", "process_vm_writev",
    # mounts and namespaces (a remount read-write, a second tmpfs, a way back to the zygote)
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "open_tree",
    "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr")


def _errno_action(errno: int) -> int:
  return 0x00050000 | (errno & 0xFFFF)  # SCMP_ACT_ERRNO(errno)


_seccomp = []  # libseccomp, loaded once (by the zygote, before it forks workers)


def load_libseccomp():
  """libseccomp through ctypes, or None where it is not installed (loaded once)."""
  if not _seccomp:
    lib = None
    for name in ("libseccomp.so.2", "libseccomp.so"):  # by soname: find_library runs gcc
      try:
        lib = ctypes.CDLL(name, use_errno=True)
        break
      except OSError:
        continue
    if lib is not None:
      lib.seccomp_init.restype = ctypes.c_void_p
      lib.seccomp_init.argtypes = [ctypes.c_uint32]
      lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
      lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                             ctypes.c_uint, ctypes.c_void_p]
      lib.seccomp_load.argtypes = [ctypes.c_void_p]
      lib.seccomp_release.argtypes = [ctypes.c_void_p]
    _seccomp.append(lib)
  return _seccomp[0]


def refuse_syscalls(refused=REFUSED) -> bool:
  """Installs the seccomp filter (through libseccomp, where installed; it also sets
  no_new_privs). Returns whether it is in force."""
  lib = load_libseccomp()
  if lib is None:
    return False
  ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
  if not ctx:
    return False
  try:
    for syscall, errno in [(s, EPERM) for s in refused] + [("clone3", ENOSYS)]:
      nr = lib.seccomp_syscall_resolve_name(syscall.encode())
      if nr < 0:
        continue  # not a syscall on this architecture (fork and vfork on arm64)
      if lib.seccomp_rule_add_array(ctx, _errno_action(errno), nr, 0, None) != 0:
        return False
    return lib.seccomp_load(ctx) == 0
  finally:
    lib.seccomp_release(ctx)
