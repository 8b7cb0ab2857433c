"""Kernel containment for the sandbox worker (`_sandbox_worker.py` loads this file by path;
it imports nothing from tirjax): a read-only view of the filesystem and a seccomp filter that
refuses new processes. Both act below Python, so no rebinding, `dir_fd` trick or native call
of tool code gets around them.
"""

import ctypes
import os

# <sys/mount.h>
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 32, 1024, 2048, 4096, 16384
MS_RELATIME, MS_STRICTATIME = 1 << 21, 1 << 24
_KEPT_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
               "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME}


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
  libc = ctypes.CDLL(None, use_errno=True)
  libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                         ctypes.c_void_p]
  if libc.mount(scratch.encode(), scratch.encode(), None, MS_BIND | MS_REC, None) != 0:
    return False
  for point, flags in _mount_points():
    if point == scratch or point.startswith(scratch + os.sep):
      continue
    # nodev too: a read-only mount still lets a device node be written. A mount that refuses
    # (one the kernel locked) stays as it is; "/" is checked below.
    libc.mount(None, point.encode(), None,
               MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NODEV | MS_NOSUID | flags, None)
  return bool(os.statvfs("/").f_flag & os.ST_RDONLY)



# <seccomp.h>
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_MASKED_EQ = 7
CLONE_THREAD = 0x00010000
EPERM, ENOSYS = 1, 38


def _errno_action(errno: int) -> int:
  return 0x00050000 | (errno & 0xFFFF)  # SCMP_ACT_ERRNO(errno)


class _ArgCmp(ctypes.Structure):
  _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
              ("datum_b", ctypes.c_uint64)]


def deny_new_processes() -> bool:
  """A seccomp filter (through libseccomp, where installed) under which fork, vfork, execve,
  execveat and a clone without CLONE_THREAD fail with EPERM, and clone3 with ENOSYS (so that
  the C library falls back to clone). Threads stay possible at this level; the worker refuses
  them in Python. Returns whether the filter is in force; it also sets no_new_privs."""
  lib = None
  for name in ("libseccomp.so.2", "libseccomp.so"):  # by soname: find_library runs gcc
    try:
      lib = ctypes.CDLL(name, use_errno=True)
      break
    except OSError:
      continue
  if lib is None:
    return False
  lib.seccomp_init.restype = ctypes.c_void_p
  lib.seccomp_init.argtypes = [ctypes.c_uint32]
  lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
  lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                         ctypes.c_uint, ctypes.POINTER(_ArgCmp)]
  lib.seccomp_load.argtypes = [ctypes.c_void_p]
  lib.seccomp_release.argtypes = [ctypes.c_void_p]
  ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
  if not ctx:
    return False
  try:
    rules = [("fork", EPERM, None), ("vfork", EPERM, None), ("execve", EPERM, None),
             ("execveat", EPERM, None), ("clone3", ENOSYS, None),
             ("clone", EPERM, _ArgCmp(0, SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0))]
    for syscall, errno, cmp in rules:
      nr = lib.seccomp_syscall_resolve_name(syscall.encode())
      if nr < 0:
        continue  # not a syscall on this architecture (fork and vfork on arm64)
      args = (_ArgCmp * 1)(cmp) if cmp is not None else None
      if lib.seccomp_rule_add_array(ctx, _errno_action(errno), nr, 1 if cmp else 0, args) != 0:
        return False
    return lib.seccomp_load(ctx) == 0
  finally:
    lib.seccomp_release(ctx)
