"""The owner's folders for the sandbox: made with names no tool can predict, removed by a walk
that no tree a tool made can break.

Where the kernel contains the workers, the owner's scratch root stays empty on the host's disk
(the zygote covers it with a tmpfs in its own mount namespace), so removing it is one rmdir.
Without namespaces, workers write real files under it, and their trees are hostile: thousands
deep (a recursive walk raises RecursionError), full of symlinks, unreadable modes. `remove_tree`
walks them with one open folder at a time and no recursion, never follows a link, and stops
rather than deletes when a folder is not where it was.
"""

from __future__ import annotations

import os
import secrets
import stat
import tempfile

SCRATCH_PREFIX = "tirjax-sandbox-"
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def new_name() -> str:
  """A name for a worker's scratch folder that no tool code can guess in advance."""
  return secrets.token_hex(12)


def _same(a: os.stat_result, b: os.stat_result) -> bool:
  return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _open_dir(name: str, dir_fd: int) -> int:
  try:
    return os.open(name, _DIR, dir_fd=dir_fd)
  except PermissionError:  # a folder tool code made unreadable (we own it, or are root)
    os.chmod(name, 0o700, dir_fd=dir_fd)  # a folder (scandir said so, without following)
    return os.open(name, _DIR, dir_fd=dir_fd)


def _empty_of_files(fd: int) -> list[str]:
  """Unlinks every entry of folder `fd` but its sub-folders; returns their names. A folder
  tool code made read-only is made writable first (we own it, or are root)."""
  try:
    os.fchmod(fd, stat.S_IRWXU)
  except OSError:
    pass  # not ours: an unlink below says so
  folders = []
  with os.scandir(fd) as entries:
    for entry in entries:
      if entry.is_dir(follow_symlinks=False):
        folders.append(entry.name)
      else:
        os.unlink(entry.name, dir_fd=fd)
  return folders


def remove_tree(path: str) -> None:
  """Removes `path` and everything under it, depth first, holding one folder open at a time
  and a list of names per level (memory in the tree's size, no recursion, no limit on its
  depth). Going back up, the parent reached through ".." must be the folder it came from,
  else it raises OSError and deletes nothing more. A missing `path` is no error."""
  try:
    fd = os.open(path, _DIR)
  except FileNotFoundError:
    return
  except NotADirectoryError:
    os.unlink(path)
    return
  except OSError:  # a symlink (O_NOFOLLOW): remove the link, not its target
    if stat.S_ISLNK(os.lstat(path).st_mode):
      os.unlink(path)
      return
    raise
  stack = [(None, os.fstat(fd), _empty_of_files(fd))]  # (name, identity, sub-folders left)
  try:
    while True:
      name, _, pending = stack[-1]
      if pending:
        child = pending.pop()
        child_fd = _open_dir(child, fd)
        os.close(fd)
        fd = child_fd
        stack.append((child, os.fstat(fd), _empty_of_files(fd)))
        continue
      if len(stack) == 1:
        break
      stack.pop()
      parent = os.open("..", _DIR, dir_fd=fd)
      os.close(fd)
      fd = parent
      if not _same(os.fstat(fd), stack[-1][1]):
        raise OSError(f"{path}: a folder moved while it was being removed")
      os.rmdir(name, dir_fd=fd)
  finally:
    os.close(fd)
  os.rmdir(path)


def remove_orphaned_scratch() -> None:
  """Scratch roots whose owning process is gone (it was killed before it could clean up).
  Never raises: one owner's leftovers do not stop another sandbox from starting."""
  tmp = tempfile.gettempdir()
  try:
    names = os.listdir(tmp)
  except OSError:
    return
  for name in names:
    if not name.startswith(SCRATCH_PREFIX):
      continue
    owner = name[len(SCRATCH_PREFIX):].split("-", 1)[0]
    if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
      try:
        remove_tree(os.path.join(tmp, name))
      except OSError:
        continue
