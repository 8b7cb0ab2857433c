"""Small vLLM servers and their processes, for the vLLM tests: server options, finding a
server's processes by its tag, and killing one mid-batch."""

import os
import signal
import threading
import time

import psutil

from tirjax.sampling import vllm_server

MAX_MODEL_LEN = 256
KV_CACHE_BYTES = 16 * 2**20  # 16384 tokens of the tiny model: 1 KiB per token


def server_options(model_dir: str, **overrides) -> vllm_server.ServerOptions:
  """The tiny model's server options; its log beside `model_dir`, in the test's folders."""
  overrides.setdefault("log_path", os.path.abspath(model_dir) + "-vllm-server.log")
  return vllm_server.ServerOptions(model=model_dir, max_model_len=MAX_MODEL_LEN,
                                   kv_cache_memory_bytes=KV_CACHE_BYTES, **overrides)


def tagged_pids(tag: str) -> list[int]:
  """Live processes whose environment carries this server tag.

  Read from /proc, not psutil: vLLM's engine core renames itself (setproctitle), which writes
  NULs over the start of its environment block, and psutil's parser stops at the first empty
  entry, so it would miss the tag that follows."""
  needle = f"{vllm_server.TAG_ENV}={tag}".encode()
  pids = []
  for pid in psutil.pids():
    try:
      with open(f"/proc/{pid}/environ", "rb") as f:
        if needle in f.read().split(b"\0"):
          pids.append(pid)
    except OSError:  # gone, or a zombie
      pass
  return pids


def cmdline(pid: int) -> str:
  try:
    return " ".join(psutil.Process(pid).cmdline())
  except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
    return ""


def wait_until(predicate, timeout: float, interval: float = 0.1) -> bool:
  deadline = time.monotonic() + timeout
  while not predicate():
    if time.monotonic() > deadline:
      return False
    time.sleep(interval)
  return True


def api_server_pid(server) -> int:
  """The pid of a launched server's API process (not its supervisor)."""
  [api] = [p for p in server.pids() if "api_server" in cmdline(p)
           and "vllm_supervisor" not in cmdline(p)]
  return api


def kill_mid_batch(batch_fn, url: str, pid: int, in_flight):
  """Runs `batch_fn()` in a thread, SIGKILLs `pid` (the server at `url`) once `in_flight()`
  says the batch's requests are out at it, and returns the batch's result (re-raising its
  error) — a kill staged on an observable state, not after a sleep. The tests count requests
  sent and not answered: vLLM's own request gauges, on two loaded cores, can read 0 through a
  whole batch."""
  result = {}

  def run():
    try:
      result["out"] = batch_fn()
    except Exception as e:  # noqa: BLE001  (re-raised below, in the test's thread)
      result["error"] = e

  thread = threading.Thread(target=run)
  thread.start()

  assert wait_until(in_flight, 120, interval=0.005), (
      f"no request of the batch in flight at {url}")
  assert thread.is_alive(), "the batch finished before the kill"
  os.kill(pid, signal.SIGKILL)
  thread.join(600)
  if "error" in result:
    raise result["error"]
  return result["out"]
