"""Kernel containment for the sandbox's processes (`_sandbox_worker.py` loads this file by
path; it imports nothing from tirjax). Everything here acts below Python, so no rebinding,
`gc` walk, `dir_fd` trick or native call of tool code gets around it:

* `new_user_namespace`, `zygote_namespaces`: the zygote's user, network, IPC, PID and mount
  namespaces (the owner writes the user namespace's id maps);
* `contain`: the zygote's view of the filesystem: every mount read-only, the folders on the
  way to the interpreter reachable by an unprivileged worker (`expose`), and a private tmpfs
  over the scratch root, the one place the zygote writes (the workers' mount points);
* `new_namespaces`: a fresh PID, mount, network and IPC namespace for each worker;
* `isolate`: the worker's own /proc and its size-limited tmpfs scratch folder, with the
  scratch root read-only in its view;
* `drop_privileges`: no capabilities, an unprivileged uid and gid, no_new_privs;
* `refuse_syscalls`: a seccomp filter refusing new processes and threads, other processes,
  mounts and namespaces, memory outside the limit (memfd, SysV IPC, larger pipes), sockets of
  every family, io_uring, userfaultfd, the keyrings, inotify and fanotify, perf events and
  bpf.

Each returns whether it took effect, so that the sandbox reports a layer that is missing
rather than assuming it.
"""

import ctypes
import os
import stat

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_void_p]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                        ctypes.c_ulong]

# <sys/mount.h>
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 32, 1024, 2048, 4096, 16384
MS_PRIVATE, MS_RELATIME = 1 << 18, 1 << 21
LOCKED_DOWN = MS_NOSUID | MS_NODEV | MS_NOEXEC  # every writable mount a worker sees
_KEPT_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
               "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME}
# <sched.h>, <sys/prctl.h>
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 1, 4, 24
PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 47, 4


def _mount(source, target, fstype, flags, options=None) -> bool:
  enc = lambda s: None if s is None else os.fsencode(s)  # noqa: E731
  return _libc.mount(enc(source), enc(target), enc(fstype), flags, enc(options)) == 0


def _mount_points() -> list[tuple[str, int]]:
  """(mount point, its per-mount flags to keep) from /proc/self/mountinfo, each point once."""
  out = {}
  with open("/proc/self/mountinfo") as f:
    for line in f:
      fields = line.split()
      point = fields[4].encode().decode("unicode_escape")  # "\040" etc. in names
      out[point] = sum(_KEPT_FLAGS.get(o, 0) for o in fields[5].split(","))
  return list(out.items())


def _within(path: str, folder: str) -> bool:
  return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def writable_mounts(skip=()) -> list[str]:
  """Mount points (outside `skip`) where the mount a path reaches is writable."""
  out = []
  for point, _ in _mount_points():
    if any(_within(point, s) for s in skip):
      continue
    try:
      if not os.statvfs(point).f_flag & os.ST_RDONLY:
        out.append(point)
    except OSError:
      continue  # a point under a folder this process cannot enter: no path reaches it
  return out


def new_user_namespace() -> bool:
  """A user namespace of the zygote's own; its id maps are the owner's to write (it alone
  may map more than one id: root to root, and the worker's unprivileged id)."""
  return _libc.unshare(CLONE_NEWUSER) == 0


def zygote_namespaces(contained: bool) -> bool:
  """Network and IPC namespaces, and, `contained`, PID (for the next child) and mount ones."""
  flags = CLONE_NEWNET | CLONE_NEWIPC | (CLONE_NEWPID | CLONE_NEWNS if contained else 0)
  return _libc.unshare(flags) == 0


def _blocked_ancestor(paths: list[str]):
  """The shallowest folder on the way to one of `paths` that others may not search."""
  for path in paths:
    parts = path.split(os.sep)
    for i in range(2, len(parts)):
      folder = os.sep.join(parts[:i])
      if not os.stat(folder).st_mode & stat.S_IXOTH:
        return folder
  return None


def expose(paths: list[str]) -> bool:
  """Makes `paths` reachable by a user without rights to their folders (an interpreter under
  root's private home): each folder on the way that others may not search is covered, in
  this mount namespace only, by a tmpfs (mode 0755) holding bind mounts of just the entries
  on the way, so nothing else of that folder shows. The tmpfs is made read-only by
  `contain`. Returns whether every path is reachable."""
  paths = sorted({p for path in paths if os.path.isabs(path)
                  for p in (os.path.normpath(path), os.path.realpath(path))})
  for _ in range(64):  # each round covers one folder; a deeper one may follow it
    folder = _blocked_ancestor(paths)
    if folder is None:
      return True
    names = sorted({p[len(folder) + 1:].split(os.sep)[0] for p in paths
                    if p.startswith(folder + os.sep)})
    entries = []
    for name in names:
      path = os.path.join(folder, name)
      fd = os.open(path, os.O_PATH | os.O_NOFOLLOW)
      link = os.readlink(path) if stat.S_ISLNK(os.fstat(fd).st_mode) else None
      entries.append((name, fd, link))
    try:
      if not _mount("tmpfs", folder, "tmpfs", LOCKED_DOWN, "mode=0755,size=64k"):
        return False
      for name, fd, link in entries:
        target = os.path.join(folder, name)
        if link is not None:
          os.symlink(link, target)
          continue
        if stat.S_ISDIR(os.fstat(fd).st_mode):
          os.mkdir(target)
        else:
          os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
        if not _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC):
          return False
    finally:
      for _, fd, _ in entries:
        os.close(fd)
  return False


def private_view(exposed: list[str]) -> bool:
  """Without the contained mode's namespaces: a mount namespace of its own (possible for
  root), only to make `exposed` reachable by the workers' unprivileged user."""
  return (_libc.unshare(CLONE_NEWNS) == 0 and _mount(None, "/", None, MS_REC | MS_PRIVATE)
          and expose(exposed))


def contain(root: str, exposed: list[str]) -> bool:
  """In the zygote's new mount namespace (as root of its user namespace): makes `exposed`
  reachable (`expose`), remounts every mount read-only, nosuid and nodev, and mounts a
  private tmpfs over the scratch root `root`, where the zygote makes the workers' mount
  points: no folder of the host's disk is writable here, by any path. Returns whether every
  mount but the scratch root is read-only."""
  if not _mount(None, "/", None, MS_REC | MS_PRIVATE):
    return False
  if exposed and not expose(exposed):
    return False
  for point, flags in _mount_points():
    # nodev too: a read-only mount still lets a device node be written. A mount that refuses
    # (one the kernel locked) stays as it is; the check below finds it.
    _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NODEV | MS_NOSUID | flags)
  if not _mount("tmpfs", root, "tmpfs", LOCKED_DOWN, "mode=0755,size=1m"):
    return False
  return writable_mounts(skip=(root,)) == []


def new_namespaces() -> bool:
  """New PID (for the next child), mount, network and IPC namespaces: the worker forked next
  is the init of a PID namespace of its own, sees no other worker, shares no loopback and no
  SysV or POSIX IPC object (they die with it)."""
  return _libc.unshare(CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC) == 0


def isolate(scratch: str, scratch_bytes: int, ids) -> dict:
  """In the worker's own namespaces: a /proc that shows only its PID namespace, the scratch
  root read-only, and a tmpfs of `scratch_bytes` (one inode per 4 KiB) over its scratch
  folder, owned by `ids` (uid, gid; None: root of the user namespace), nosuid, nodev and
  noexec. Returns which layers are in force ("pid_namespace", "scratch_quota",
  "readonly_filesystem": its scratch (and /proc) the only writable mounts,
  "writable_mounts_noexec": those nosuid, nodev and noexec)."""
  root = os.path.dirname(scratch)
  proc = _mount("proc", "/proc", "proc", LOCKED_DOWN)
  sealed = _mount(None, root, None, MS_REMOUNT | MS_BIND | MS_RDONLY | LOCKED_DOWN)
  owner = "" if ids is None else f",uid={ids[0]},gid={ids[1]}"
  options = f"size={scratch_bytes},nr_inodes={max(64, scratch_bytes // 4096)},mode=0700{owner}"
  quota = _mount("tmpfs", scratch, "tmpfs", LOCKED_DOWN, options)
  if quota:
    fs = os.statvfs(scratch)
    quota = fs.f_blocks * fs.f_frsize <= scratch_bytes
  writable = writable_mounts(skip=("/proc",))  # its own /proc, and what it covers
  locked = os.ST_NOSUID | os.ST_NODEV | os.ST_NOEXEC
  return {"pid_namespace": proc and os.getpid() == 1, "scratch_quota": quota,
          "readonly_filesystem": sealed and set(writable) <= {scratch},
          "writable_mounts_noexec": all(os.statvfs(p).f_flag & locked == locked
                                        for p in writable + ["/proc"])}


def die_with_parent(signal_number: int) -> bool:
  """The calling process gets `signal_number` when its parent dies."""
  return _libc.prctl(PR_SET_PDEATHSIG, signal_number, 0, 0, 0) == 0


class _CapHeader(ctypes.Structure):
  _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
  _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
              ("inheritable", ctypes.c_uint32)]


def _status() -> dict:
  with open("/proc/self/status") as f:
    return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def drop_privileges(ids) -> bool:
  """Empties the bounding and ambient sets, then becomes `ids` (uid, gid; None: stays the
  user namespace's root, which maps to the unprivileged owner) with no supplementary groups,
  which empties the effective and permitted sets; then no_new_privs (no exec could gain
  anything) and not dumpable (its /proc/PID/mem closed to processes of the same user).
  Returns whether the process holds no capability and runs with no_new_privs (the bounding
  set of an unprivileged user stays full: it only limits what an exec could gain)."""
  for cap in range(64):
    if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 22:
      break  # EINVAL: past the last capability this kernel knows
  _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
  if ids is not None:
    try:
      os.setgroups([])
      os.setresgid(ids[1], ids[1], ids[1])
      os.setresuid(ids[0], ids[0], ids[0])
    except OSError:
      return False
  _libc.capset(ctypes.byref(_CapHeader(0x20080522, 0)), (_CapData * 2)())  # version 3
  _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
  _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # after the id change, which resets it
  status = _status()
  return (not any(int(status[k], 16) for k in ("CapEff", "CapPrm", "CapAmb"))
          and status.get("NoNewPrivs") == "1")


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
    "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    # memory RLIMIT_AS does not count: a memfd's pages, SysV and POSIX IPC objects
    "memfd_create", "memfd_secret", "shmget", "msgget", "semget", "mq_open",
    # kernel interfaces a tool has no use for: io_uring (and its SQPOLL thread), user-mode
    # page faults, the keyrings (the user keyring is shared by every process of the uid)
    "io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd", "keyctl",
    "add_key", "request_key",
    # sockets, of every family (issue 56): a path socket of the host's (its /tmp, /run) is
    # reachable through a read-only mount and the network namespace scopes only abstract
    # names, AF_VSOCK reaches the hypervisor, and a socket's queued buffers are kernel memory
    # no rlimit counts (1,000 socketpairs held 444 MiB). The worker's own channel is a pair
    # of pipes, made before the filter; Python's socket module is refused by the audit hook
    # already, so no tool that worked before needs one
    "socket", "socketpair",
    # names the owner and other workers make, watched as they appear (issue 56)
    "inotify_init", "inotify_init1", "fanotify_init",
    # kernel memory and counters of the whole host
    "perf_event_open", "bpf")
# (system call, argument index, value) refused with EPERM when that argument has that value:
# fcntl(F_SETPIPE_SZ) would grow a pipe from 64 KiB up to /proc/sys/fs/pipe-max-size (1 MiB),
# kernel memory outside RLIMIT_AS; without it the worker's pipes hold at most RLIMIT_NOFILE / 2
# times 64 KiB.
F_SETPIPE_SZ = 1031
REFUSED_WHEN = (("fcntl", 1, F_SETPIPE_SZ),)


class _ArgCmp(ctypes.Structure):  # struct scmp_arg_cmp
  _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
              ("datum_b", ctypes.c_uint64)]


SCMP_CMP_EQ = 4


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


def refuse_syscalls(refused=REFUSED, refused_when=REFUSED_WHEN) -> bool:
  """Installs the seccomp filter (through libseccomp, where installed; it also sets
  no_new_privs). Returns whether it is in force."""
  lib = load_libseccomp()
  if lib is None:
    return False
  ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
  if not ctx:
    return False
  rules = ([(s, EPERM, None) for s in refused] + [("clone3", ENOSYS, None)]
           + [(s, EPERM, _ArgCmp(arg, SCMP_CMP_EQ, value, 0))
              for s, arg, value in refused_when])
  try:
    for syscall, errno, when in rules:
      nr = lib.seccomp_syscall_resolve_name(syscall.encode())
      if nr < 0:
        continue  # not a syscall on this architecture (fork and vfork on arm64)
      conditions = (0, None) if when is None else (1, ctypes.byref(when))
      if lib.seccomp_rule_add_array(ctx, _errno_action(errno), nr, *conditions) != 0:
        return False
    return lib.seccomp_load(ctx) == 0
  finally:
    lib.seccomp_release(ctx)
