"""Shared by the vLLM tests: small-server options and finding a server's processes."""

import os
import time

import psutil

from tirjax.sampling import vllm_server

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_MODEL_LEN = 256
KV_CACHE_BYTES = 16 * 2**20  # 16384 tokens of the tiny model: 1 KiB per token


def server_options(model_dir: str, **overrides) -> vllm_server.ServerOptions:
  return vllm_server.ServerOptions(model=model_dir, max_model_len=MAX_MODEL_LEN,
                                   kv_cache_memory_bytes=KV_CACHE_BYTES, **overrides)


def tagged_pids(tag: str) -> list[int]:
  """Live processes whose environment carries this server tag."""
  pids = []
  for proc in psutil.process_iter():
    try:
      if proc.environ().get(vllm_server.TAG_ENV) == tag:
        pids.append(proc.pid)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):  # gone
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
