"""No vLLM process outlives its trainer: supervisor logic, start-up time-out, crash, Ctrl-C.

The supervisor tests run a stand-in process tree (Python children that sleep, one ignoring
SIGTERM); the others launch real vLLM servers of a tiny model from `.venv-vllm`. Every process
of a server carries its tag in its environment, which is how leftovers are found in /proc.
"""

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from tirjax.sampling import vllm_server, vllm_supervisor
from tirjax.testing import tiny_hf, vllm_processes as support

pytestmark = pytest.mark.xdist_group("vllm")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A child that starts a grandchild ignoring SIGTERM, then sleeps (or exits, with "exit").
TREE = """
import signal, subprocess, sys, time
subprocess.Popen([sys.executable, "-c",
                  "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                  "time.sleep(600)"])
if sys.argv[1:] != ["exit"]:
  time.sleep(600)
"""

# Launches the supervisor over TREE (from a thread that ends at once, with "thread"), with a
# directory to clean up, prints its pid, then waits to be killed.
LAUNCHER = """
import os, subprocess, sys, threading, time
tree, mode, tmp = sys.argv[1], sys.argv[2], sys.argv[3]
cmd = [sys.executable, {supervisor!r}, "--parent", str(os.getpid()), "--grace", "1",
       "--cleanup", tmp, "--", sys.executable, "-c", tree] + (["exit"] if mode == "exit" else [])
procs = []
launch = lambda: procs.append(subprocess.Popen(cmd, start_new_session=True))
if mode == "thread":
  t = threading.Thread(target=launch)
  t.start()
  t.join()
else:
  launch()
print(procs[0].pid, flush=True)
time.sleep(600)
""".format(supervisor=vllm_supervisor.__file__)

# A trainer that launches a vLLM server of the model in argv[1] and then works forever.
TRAINER = """
import sys, time
from tirjax.sampling import vllm_server
from tirjax.testing import vllm_processes
server = vllm_server.VLLMServer(vllm_processes.server_options(sys.argv[1]))
print("TAG", server.tag, flush=True)
server.start()
print("READY", flush=True)
time.sleep(600)
"""


def _default_sigint():
  """pytest-xdist workers ignore SIGINT and children inherit that: restore Python's default."""
  signal.signal(signal.SIGINT, signal.SIG_DFL)


def spawn(script, *args, tag=None):
  env = dict(os.environ, PYTHONPATH=REPO)
  if tag is not None:
    env[vllm_server.TAG_ENV] = tag
  return subprocess.Popen(preexec_fn=_default_sigint, args=[sys.executable, "-c", script, *args], env=env, cwd=REPO,
                          stdout=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("vllm_tiny"))
  tiny_hf.save_model(path)
  return path


@pytest.mark.parametrize("mode", ["direct", "thread"])
def test_supervisor_ends_the_whole_tree_when_its_parent_is_killed(mode, tmp_path):
  tag = uuid.uuid4().hex
  (tmp_path / "sockets").mkdir()
  launcher = spawn(LAUNCHER, TREE, mode, str(tmp_path / "sockets"), tag=tag)
  try:
    int(launcher.stdout.readline())
    # launcher, supervisor, child, grandchild; the launching thread has ended in "thread" mode
    # and must not have taken the tree down.
    assert support.wait_until(lambda: len(support.tagged_pids(tag)) == 4, 20)
    time.sleep(1.0)
    assert len(support.tagged_pids(tag)) == 4
    launcher.kill()
    launcher.wait()
    # The grandchild ignores SIGTERM: it goes only by SIGKILL, after the 1 s grace.
    assert support.wait_until(lambda: not support.tagged_pids(tag), 15), [
        support.cmdline(p) for p in support.tagged_pids(tag)]
    assert support.wait_until(lambda: not (tmp_path / "sockets").exists(), 5)
  finally:
    launcher.kill()
    for pid in support.tagged_pids(tag):
      os.kill(pid, signal.SIGKILL)


def test_supervisor_ends_the_tree_when_its_child_exits(tmp_path):
  tag = uuid.uuid4().hex
  launcher = spawn(LAUNCHER, TREE, "exit", str(tmp_path / "sockets"), tag=tag)
  try:
    supervisor = int(launcher.stdout.readline())
    # Only the launcher remains once the child has exited: the supervisor killed the
    # orphaned grandchild and exited itself.
    assert support.wait_until(lambda: support.tagged_pids(tag) == [launcher.pid], 15), [
        support.cmdline(p) for p in support.tagged_pids(tag)]
    assert supervisor not in support.tagged_pids(tag)
  finally:
    launcher.kill()
    for pid in support.tagged_pids(tag):
      os.kill(pid, signal.SIGKILL)


def test_start_up_time_out_leaves_no_process(model_dir):
  server = vllm_server.VLLMServer(support.server_options(model_dir, startup_timeout_s=3.0))
  with pytest.raises(vllm_server.ServerStartError, match=r"not healthy after 3 s"):
    server.start()
  assert support.tagged_pids(server.tag) == []
  assert not server.running()
  # its output kept for the post-mortem, in the test's folders rather than the shared /tmp
  assert server.log_path == model_dir + "-vllm-server.log" and os.path.exists(server.log_path)


def test_trainer_crash_leaves_no_process(model_dir):
  trainer = spawn(TRAINER, model_dir)
  tag = None
  try:
    tag = trainer.stdout.readline().split()[1]
    assert trainer.stdout.readline().strip() == "READY"
    pids = support.tagged_pids(tag)
    assert any("VLLM::EngineCore" in support.cmdline(p) for p in pids), pids
    trainer.kill()  # SIGKILL: no atexit, no handler; only the supervisor can clean up
    trainer.wait()
    assert support.wait_until(lambda: not support.tagged_pids(tag), 30), [
        support.cmdline(p) for p in support.tagged_pids(tag)]
  finally:
    trainer.kill()
    for pid in support.tagged_pids(tag) if tag else []:
      os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_during_start_up_leaves_no_process(model_dir, signum):
  trainer = spawn(TRAINER, model_dir)
  tag = None
  try:
    tag = trainer.stdout.readline().split()[1]
    # Interrupt once vLLM's engine core exists: a child that the API server does not stop
    # when it is killed.
    assert support.wait_until(lambda: any(
        "VLLM::EngineCore" in support.cmdline(p) for p in support.tagged_pids(tag)), 300, 0.5)
    trainer.send_signal(signum)
    assert trainer.wait(180) == -signum  # KeyboardInterrupt, or the re-raised SIGTERM
    assert support.tagged_pids(tag) == []  # closed before the trainer exited
  finally:
    trainer.kill()
    for pid in support.tagged_pids(tag) if tag else []:
      os.kill(pid, signal.SIGKILL)
