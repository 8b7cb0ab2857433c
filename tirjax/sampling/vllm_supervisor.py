"""Keeps a vLLM server's process tree from outliving the trainer that started it.

Run as a script, by the vLLM environment's Python (it needs only psutil, which vLLM requires;
its command line is read with argparse, not absl, which that environment does not have):

  python vllm_supervisor.py --parent PID --grace SECONDS [--cleanup DIR] -- CMD...

The launcher starts this script as the leader of a new process group; CMD (vLLM's API server)
and everything it spawns (the engine core and its workers) stay in that group. vLLM alone does
not suffice: when its API server is killed, the engine core and workers keep running,
re-parented to init. The supervisor ends the whole group when

- it gets SIGTERM, SIGINT or SIGHUP (the launcher's orderly shutdown),
- its parent process dies (SIGUSR1 from the kernel, and a poll of `getppid()` as a backstop),
- CMD exits by itself (a crashed server leaves no engine behind).

Ending the group: SIGTERM to CMD, up to `grace` seconds for vLLM's own shutdown, then SIGKILL
to every process left in the group; then DIR (the server's TMPDIR, where vLLM leaves its IPC
sockets) is removed. The death signal is SIGUSR1 rather than SIGTERM because the
kernel sends it when the *thread* that forked exits: a launch from a short-lived thread must not
kill the server, so SIGUSR1 only counts once `getppid()` shows the parent process is gone.
The supervisor sets `PR_SET_PDEATHSIG` on itself, first thing, rather than the launcher in a
`preexec_fn`: that runs between fork and exec in a trainer with many threads (JAX's), where
Python's documentation warns it can deadlock; checking `getppid()` right after closes the
window in which the parent could die unnoticed.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time

import psutil

POLL_S = 0.5
_PR_SET_PDEATHSIG = 1


def die_with_parent(signum: int) -> None:
  """Asks the kernel to send `signum` to this process when its parent (thread) dies."""
  libc = ctypes.CDLL(None, use_errno=True)
  if libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
    raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def group_members(pgid: int) -> list[int]:
  """Pids of the live (non-zombie) processes in process group `pgid`."""
  pids = []
  for proc in psutil.process_iter(["status"]):
    try:
      if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
        pids.append(proc.pid)
    except (ProcessLookupError, PermissionError, psutil.Error):
      continue  # gone since the listing
  return pids


def kill_group(pgid: int, skip: int) -> None:
  """SIGKILLs every process of group `pgid` except `skip`."""
  for pid in group_members(pgid):
    if pid != skip:
      try:
        psutil.Process(pid).kill()
      except psutil.NoSuchProcess:
        pass


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--parent", type=int, required=True, help="pid of the launching process")
  parser.add_argument("--grace", type=float, default=10.0, help="seconds for CMD to stop")
  parser.add_argument("--cleanup", help="directory to remove once the group has ended")
  parser.add_argument("cmd", nargs=argparse.REMAINDER)
  args = parser.parse_args(argv)
  cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
  if not cmd:
    parser.error("no command given after --")

  stop = []

  def on_stop(signum, frame):
    del frame
    stop.append(signum)

  def on_parent_death(signum, frame):
    if os.getppid() != args.parent:
      on_stop(signum, frame)

  for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(sig, on_stop)
  signal.signal(signal.SIGUSR1, on_parent_death)
  die_with_parent(signal.SIGUSR1)
  if os.getppid() != args.parent:  # the parent died before PR_SET_PDEATHSIG was in place
    return 1

  child = subprocess.Popen(cmd)
  rc = None
  while rc is None and not stop and os.getppid() == args.parent:
    try:
      rc = child.wait(timeout=POLL_S)
    except subprocess.TimeoutExpired:
      pass
  if rc is None:
    child.terminate()
  pgid, me = os.getpgid(0), os.getpid()
  deadline = time.monotonic() + args.grace
  while set(group_members(pgid)) - {me} and time.monotonic() < deadline:
    child.poll()  # reaps CMD once it exits, so that it stops counting
    time.sleep(0.05)
  kill_group(pgid, skip=me)
  child.wait()
  if args.cleanup:
    shutil.rmtree(args.cleanup, ignore_errors=True)
  return child.returncode if rc is not None else 128 + (stop[0] if stop else signal.SIGTERM)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
