"""The vLLM sampler (spec §7): an OpenAI-compatible vLLM server behind the `Sampler` interface.

Token-in, token-out: prompts go to `/v1/completions` as token-id lists, and each sample comes
back as the ids vLLM sampled (`return_tokens_as_token_ids`), never decoded and re-encoded, the
stop token included, with vLLM's raw-model log-prob of each (`logprobs: 0`, or the top-k).
Sampling is fully specified by each request (temperature, top-p, no top-k, stop token ids,
`ignore_eos`): only `SamplingParams.stop_token_ids` end a sample.

Seeds: each prompt is its own request, seeded from (`params.seed`, the call's index, the
prompt's index), or from (`params.seed`, the prompt's `row_ids` id) when given; vLLM seeds
the n samples of a request with seed, seed + 1, … The same
sequence of calls on the same weights thus repeats its samples (up to numerical differences
between batch compositions), while equal prompts in one batch, or the same prompt in two
calls, get independent samples.

New weights (`load_weights`) are an HF safetensors directory that the server loads in place
with `reload_weights(weights_path=…)` through `POST /collective_rpc` (the server runs with
`VLLM_SERVER_DEV_MODE=1`), after which the prefix cache is reset and, given a teacher, the
log-probs of a probe batch are checked against it (`handover.py`). Tied weights are then
re-processed (`vllm_worker/tirjax_worker_ext.py`: on CPU, vLLM would keep the old LM head of a
model with tied embeddings). Servers launched by `VLLMServer` carry that worker extension; a
server launched otherwise lacks it, which is tolerated: the check is what catches a stale head.

vLLM's CPU attention does not support the `tiny` preset's head size (16; an engine error at the
first request): the trainer's tiny model has head size `TINY_HEAD_DIM` = 32, and the
trainer refuses a smaller one with vLLM.

Failures: a health check precedes every batch. When the server is down, does not answer in
time (`request_timeout_s`), or answers HTTP 5xx and then fails its health check, a server this
sampler launched is restarted once (with the current weights re-loaded) and the batch retried;
a second failure, or any failure of a server it only attached to, raises `SamplerError`. An
HTTP 5xx from a server that is still healthy (e.g. `reload_weights` of a bad directory) is the
request's fault: it raises `SamplerError` at once.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import logging
import os
import threading
import time
from typing import Callable, Optional, Sequence, TypeVar

from tirjax import option_checks
from tirjax.sampling import handover
from tirjax.sampling.interface import Sample, SamplingParams
from tirjax.sampling.vllm_server import (RequestRejected, ServerError, ServerOptions,
                                         ServerUnavailable, VLLMServer, healthy, metrics,
                                         request_json)

_T = TypeVar("_T")
_log = logging.getLogger(__name__)
_TOKEN_PREFIX = "token_id:"
_REFRESH = "refresh_tied_weights"

# vLLM 0.32's CPU attention supports head sizes 32, 64, 80, …, 512
# (`CPUAttentionBackend.get_supported_head_sizes`), not the `tiny` preset's 16.
TINY_HEAD_DIM = 32  # the `tiny` preset's head size when vLLM serves it


class SamplerError(RuntimeError):
  """The vLLM server failed in a way that a restart did not, or could not, fix."""


@dataclasses.dataclass(frozen=True)
class VLLMOptions:
  """Where the server is and how to talk to it.

  Attributes:
    url: attach to the server already running there (e.g. "http://127.0.0.1:8000"); or
    server: launch (and own) one with these options. Exactly one of the two.
    request_timeout_s: longest wait for one completion request.
    health_timeout_s: longest wait for the health check before a batch.
    max_concurrency: completion requests in flight at once (one per prompt).
    handover_tolerance: largest admissible |vLLM − teacher| log-prob gap after a hand-over
      (1e-3 suits float32 on both sides; bf16 needs far more).
    probe_prompts: prompts of the hand-over check.
    probe_new_tokens: tokens sampled per probe prompt.
  """
  url: Optional[str] = None
  server: Optional[ServerOptions] = None
  request_timeout_s: float = 600.0
  health_timeout_s: float = 10.0
  max_concurrency: int = 64
  handover_tolerance: float = 1e-3
  probe_prompts: tuple[tuple[int, ...], ...] = handover.probe_prompts()
  probe_new_tokens: int = 16

  def __post_init__(self):
    if (self.url is None) == (self.server is None):
      raise ValueError("url, server: give exactly one (attach to a server, or launch one)")
    for name in ("request_timeout_s", "health_timeout_s", "handover_tolerance"):
      option_checks.above(name, getattr(self, name), 0)
    option_checks.at_least("max_concurrency", self.max_concurrency, 1)
    if not self.probe_prompts or not all(self.probe_prompts):
      raise ValueError("probe_prompts: need at least one prompt, none of them empty")
    option_checks.at_least("probe_new_tokens", self.probe_new_tokens, 1)


@dataclasses.dataclass(frozen=True)
class HandoverReport:
  """What a hand-over did and how long each part took (seconds)."""
  policy_version: int
  weights_path: str
  reload_s: float
  reset_s: float
  check_s: float
  gap: Optional[handover.LogprobGap]  # None when no teacher was given


def prompt_seed(seed: int, call: int, index: int) -> int:
  """The request seed of prompt `index` of sampler call `call`."""
  digest = hashlib.blake2b(f"{seed}:{call}:{index}".encode(), digest_size=8).digest()
  return int.from_bytes(digest, "little") % (2**31 - 2**16)  # room for seed + n


def request_seeds(params: SamplingParams, call: int, count: int) -> list[int]:
  """Each prompt's request seed: from its `params.row_ids` id alone when given (the same
  samples wherever the prompt is sent, by whichever process), else from the call's index and
  its position in the call."""
  if params.row_ids:
    if len(params.row_ids) != count:
      raise ValueError(f"row_ids: {len(params.row_ids)} ids for {count} prompts")
    return [prompt_seed(params.seed, -1, i) for i in params.row_ids]
  return [prompt_seed(params.seed, call, i) for i in range(count)]


def _token_id(token: str) -> int:
  if not token.startswith(_TOKEN_PREFIX):
    raise SamplerError(f"vLLM returned token {token!r}, not 'token_id:<id>': the server "
                       "ignores return_tokens_as_token_ids")
  return int(token[len(_TOKEN_PREFIX):])


def _sample(choice: dict, params: SamplingParams, version: int) -> Sample:
  lp = choice.get("logprobs")
  if not lp or lp.get("tokens") is None:
    raise SamplerError(f"vLLM returned no log-probs for choice {choice.get('index')}")
  tokens = [_token_id(t) for t in lp["tokens"]]
  if choice.get("token_ids") is not None and list(choice["token_ids"]) != tokens:
    raise SamplerError(f"vLLM's token_ids {choice['token_ids']} differ from the ids in its "
                       f"log-probs {tokens}")
  reason = choice.get("finish_reason")
  if reason not in ("stop", "length"):
    raise SamplerError(f"vLLM finished a sample with reason {reason!r}")
  if reason == "stop" and (not tokens or tokens[-1] not in params.stop_token_ids):
    raise SamplerError(f"vLLM stopped on {choice.get('stop_reason')!r}, not on a stop token id")
  top = None
  if params.top_logprobs:
    top = [dict(sorted(((_token_id(k), float(v)) for k, v in d.items()),
                       key=lambda kv: -kv[1])[:params.top_logprobs])
           for d in lp["top_logprobs"]]
  return Sample(tokens=tokens, logprobs=[float(x) for x in lp["token_logprobs"]],
                finish_reason=reason, policy_version=version, top_logprobs=top)


class VLLMSampler:
  """`Sampler` on a vLLM server; see the module docstring. Close it (or use `with`)."""

  def __init__(self, options: VLLMOptions):
    self.options = options
    self.policy_version = 0
    self.restarts = 0
    self._calls = 0
    self._weights_path: Optional[str] = None
    self._unverified: Optional[str] = None
    self._server: Optional[VLLMServer] = None
    self._in_flight = 0
    self._in_flight_lock = threading.Lock()
    self.asleep = 0  # the sleep level the server was put to (0: awake)
    if options.server is not None:
      self._server = VLLMServer(options.server)
      self._server.start()
      self.url = self._server.url
    else:
      self.url = options.url.rstrip("/")
      if not healthy(self.url, options.health_timeout_s):
        raise SamplerError(f"no healthy vLLM server at {self.url}")

  @property
  def in_flight(self) -> int:
    """Requests sent to the server and not yet answered."""
    return self._in_flight

  @property
  def unverified(self) -> Optional[str]:
    """Why sampling is refused (a hand-over that did not pass), or None."""
    return self._unverified

  @property
  def server(self) -> Optional[VLLMServer]:
    """The server this sampler launched (None when attached to one)."""
    return self._server

  # Sampling.

  def generate(self, prompts: Sequence[Sequence[int]],
               params: SamplingParams) -> list[list[Sample]]:
    """For each prompt, `params.n` samples carrying the current policy version."""
    if self._unverified is not None:
      raise SamplerError(self._unverified)
    self.wake_up()
    prompts = [[int(t) for t in p] for p in prompts]
    if any(not p for p in prompts):
      raise ValueError("prompts: every prompt needs at least one token")
    if params.logprob_temperature != 1.0:
      raise ValueError(f"logprob_temperature={params.logprob_temperature}: vLLM reports the raw "
                       "model's log-probs (temperature 1) only")
    call, self._calls = self._calls, self._calls + 1
    return self._with_restart(lambda: self._generate_once(prompts, params, call))

  def _payload(self, prompt: list[int], params: SamplingParams, seed: int) -> dict:
    return {"model": "policy", "prompt": prompt, "n": params.n,
            "temperature": params.temperature, "top_p": params.top_p, "top_k": 0,
            "min_p": 0.0, "max_tokens": params.max_new_tokens,
            "stop_token_ids": list(params.stop_token_ids), "ignore_eos": True,
            "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
            "seed": seed, "logprobs": params.top_logprobs,
            "return_tokens_as_token_ids": True, "return_token_ids": True}

  def complete(self, prompt: list[int], params: SamplingParams, seed: int,
               version: int) -> list[Sample]:
    """One request: `params.n` samples of `prompt` seeded with `seed`, tagged `version`
    (no health check or restart: `generate` adds them; a fleet routes requests itself)."""
    with self._in_flight_lock:
      self._in_flight += 1
    try:
      answer = request_json(f"{self.url}/v1/completions", self._payload(prompt, params, seed),
                            timeout=self.options.request_timeout_s)
    finally:
      with self._in_flight_lock:
        self._in_flight -= 1
    choices = sorted(answer["choices"], key=lambda c: c["index"])
    if len(choices) != params.n:
      raise SamplerError(f"vLLM returned {len(choices)} choices, {params.n} requested")
    for c in choices:  # token-in: vLLM must have run the ids as sent (no BOS, no re-encoding)
      if c.get("prompt_token_ids") is not None and list(c["prompt_token_ids"]) != prompt:
        raise SamplerError(f"vLLM ran prompt ids {c['prompt_token_ids'][:20]}..., not the "
                           f"{len(prompt)} ids sent {prompt[:20]}...")
    return [_sample(c, params, version) for c in choices]

  def _generate_once(self, prompts: list[list[int]], params: SamplingParams,
                     call: int) -> list[list[Sample]]:
    version = self.policy_version
    workers = min(len(prompts), self.options.max_concurrency) or 1
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
      futures = [pool.submit(self.complete, p, params, seed, version)
                 for p, seed in zip(prompts, request_seeds(params, call, len(prompts)))]
      concurrent.futures.wait(futures)
    return [f.result() for f in futures]

  # Failures.

  def _ensure_healthy(self) -> None:
    if not healthy(self.url, self.options.health_timeout_s):
      raise ServerUnavailable(f"{self.url}/health: no healthy answer within "
                              f"{self.options.health_timeout_s:g} s")

  def _with_restart(self, fn: Callable[[], _T]) -> _T:
    try:
      self._ensure_healthy()
      return fn()
    except ServerUnavailable as first:
      if isinstance(first, ServerError) and healthy(self.url, self.options.health_timeout_s):
        raise SamplerError(f"vLLM server at {self.url} is healthy but failed the request: "
                           f"{first}") from first
      if self._server is None:
        raise SamplerError(f"vLLM server at {self.url} failed (attached, so not restarted): "
                           f"{first}") from first
      _log.warning("vLLM server failed (%s); restarting it once and retrying", first)
      try:
        self.restart()
        self._ensure_healthy()
        return fn()
      except ServerUnavailable as second:
        raise SamplerError(
            f"vLLM server failed again after a restart: {second} (first failure: {first}); "
            f"log {self._server.log_path}:\n{self._server.log_tail()}") from second

  def restart(self) -> None:
    """Restarts the launched server and re-loads the current weights into it."""
    if self._server is None:
      raise SamplerError("restart: this sampler is attached to a server it did not launch")
    self._server.restart()
    self.url = self._server.url
    self.restarts += 1
    self.asleep = 0  # a new server starts awake
    if self._weights_path is not None:
      self._reload(self._weights_path)

  # Sleep mode (vLLM's `--enable-sleep-mode`, GPUs only).

  def sleep(self, level: int) -> None:
    """Frees the server's accelerator memory between sampling phases (`POST /sleep`): level 1
    moves the weights to host memory and drops the KV cache; level 2 drops both (the next
    hand-over loads new weights anyway). The next `generate` or `load_weights` wakes it."""
    if level not in (1, 2):
      raise ValueError(f"level: vLLM's sleep levels are 1 and 2, got {level!r}")
    if self.asleep:
      return
    request_json(f"{self.url}/sleep?level={level}", {}, timeout=self.options.request_timeout_s)
    self.asleep = level

  def wake_up(self) -> None:
    """`POST /wake_up` if the server was put to sleep (a no-op otherwise)."""
    if not self.asleep:
      return
    request_json(f"{self.url}/wake_up", {}, timeout=self.options.request_timeout_s)
    self.asleep = 0

  # Weights.

  def _reload(self, path: str) -> tuple[float, float]:
    t0 = time.monotonic()
    timeout = self.options.request_timeout_s
    answer = request_json(f"{self.url}/collective_rpc",
                          {"method": "reload_weights", "kwargs": {"weights_path": path}},
                          timeout=timeout)
    if not isinstance(answer, dict) or "results" not in answer:
      raise SamplerError(f"reload_weights: unexpected answer {answer!r}")
    self._refresh_tied_weights(timeout)
    t1 = time.monotonic()
    request_json(f"{self.url}/reset_prefix_cache", {}, timeout=timeout)
    return t1 - t0, time.monotonic() - t1

  def _refresh_tied_weights(self, timeout: float) -> None:
    try:
      request_json(f"{self.url}/collective_rpc", {"method": _REFRESH}, timeout=timeout)
    except ServerError as e:
      if self._server is not None or f"no attribute '{_REFRESH}'" not in str(e):
        raise
      _log.warning("vLLM server at %s lacks tirjax's worker extension: tied weights are not "
                   "re-processed after a reload (the hand-over check catches a stale LM head)",
                   self.url)

  def prefix_cache(self) -> dict[str, float]:
    """The server's prefix-cache counters since it started: `queries` and `hits` (tokens)."""
    m = metrics(self.url, self.options.health_timeout_s)
    return {"queries": m.get("vllm:prefix_cache_queries_total", 0.0),
            "hits": m.get("vllm:prefix_cache_hits_total", 0.0)}

  def load_weights(self, path: str, version: Optional[int] = None,
                   teacher_logprobs: Optional[handover.TeacherLogprobs] = None
                   ) -> HandoverReport:
    """Hands new weights to the server, checks them, and tags the new policy version.

    Args:
      path: HF directory holding the new `*.safetensors` (same architecture and names).
      version: the new policy version; None: the current one + 1.
      teacher_logprobs: if given, the probe batch's vLLM log-probs must match it within
        `handover_tolerance` (see `handover.py`).

    Returns:
      The timings and the measured gap.

    Raises:
      WeightMismatchError: the check failed.
      SamplerError: the server could not load the weights.
      After either, the server may hold some of the new weights: `generate` refuses to
      sample until a later hand-over passes.
    """
    path = os.path.abspath(path)
    if not os.path.isdir(path) or not any(f.endswith(".safetensors") for f in os.listdir(path)):
      raise ValueError(f"path: {path!r} is not a directory with *.safetensors files")
    new_version = self.policy_version + 1 if version is None else int(version)
    self.wake_up()  # after a level-2 sleep the weights' memory is back, their values are not
    self._unverified = (f"the hand-over of {path} did not complete, so sampling is refused "
                        "until a hand-over passes")
    try:
      reload_s, reset_s = self._with_restart(lambda: self._reload(path))
    except RequestRejected as e:
      raise SamplerError(f"reload_weights from {path} failed: {e}") from e
    self._weights_path = path
    t0 = time.monotonic()
    gap = None
    if teacher_logprobs is not None:
      try:
        gap = self._check(teacher_logprobs, f"hand-over of {path}")
      except handover.WeightMismatchError as e:
        self._unverified = (f"weights from {path} failed the hand-over check, so sampling is "
                            f"refused until a hand-over passes: {e}")
        raise
    self._unverified = None
    self.policy_version = new_version
    return HandoverReport(policy_version=new_version, weights_path=path, reload_s=reload_s,
                          reset_s=reset_s, check_s=time.monotonic() - t0, gap=gap)

  def check_weights(self, teacher_logprobs: handover.TeacherLogprobs) -> handover.LogprobGap:
    """Samples the probe batch and compares its log-probs with the teacher's.

    Raises:
      WeightMismatchError: the gap exceeds `handover_tolerance`; the message gives it.
    """
    if self._unverified is not None:
      raise SamplerError(self._unverified)
    return self._check(teacher_logprobs, "weights check")

  def _check(self, teacher_logprobs: handover.TeacherLogprobs,
             what: str) -> handover.LogprobGap:
    prompts = [list(p) for p in self.options.probe_prompts]
    params = SamplingParams(max_new_tokens=self.options.probe_new_tokens)
    call, self._calls = self._calls, self._calls + 1
    samples = self._with_restart(lambda: self._generate_once(prompts, params, call))
    gap = handover.measure_gap(prompts, samples, teacher_logprobs)
    handover.check_gap(gap, self.options.handover_tolerance, what)
    return gap

  def close(self) -> None:
    if self._server is not None:
      self._server.close()

  def __enter__(self) -> "VLLMSampler":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
