"""Several vLLM servers behind one sampler (spec §9): the fleet a run outgrows one server with.

Each prompt is one request (as `VLLMSampler` sends them), routed when it is sent to the server
with the fewest requests outstanding (least-outstanding-requests, as load balancers in front of
vLLM do). Seeds follow the prompt's index in the call, not the server, so a batch samples the
same wherever its requests land (the servers hold the same weights).

Failures: a request whose server stops answering (refused or dropped connection, time-out,
HTTP 5xx and then an unhealthy server) is sent again to another live server; the dead server
takes no more requests. Once the batch is complete, each server that died is restarted once (a
server the fleet launched, with the current weights re-loaded); one that dies again, or that
was only attached to, is dropped from the fleet with a warning, and the fleet fails only when
no server is left. So nothing is lost: every prompt gets exactly its `n` samples, once.

Weights: `load_weights` hands the same directory to every server, each with its own log-prob
check against the teacher (`handover.py`); the fleet refuses to sample until every live server
has passed.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from typing import Optional, Sequence

from tirjax.sampling import handover
from tirjax.sampling.interface import Sample, SamplingParams
from tirjax.sampling.vllm import (HandoverReport, SamplerError, VLLMOptions, VLLMSampler,
                                  request_seeds)
from tirjax.sampling.vllm_server import ServerUnavailable, healthy

_log = logging.getLogger(__name__)


class VLLMFleet:
  """`Sampler` over several vLLM servers; same interface as `VLLMSampler`. Close it."""

  def __init__(self, members: Sequence[VLLMOptions]):
    if not members:
      raise ValueError("members: a fleet needs at least one server")
    self.members: list[VLLMSampler] = []
    try:
      for options in members:
        self.members.append(VLLMSampler(options))
    except BaseException:
      self.close()
      raise
    self.policy_version = 0
    self.restarts = 0
    self.retried_requests = 0
    self.requests_per_member = [0] * len(self.members)
    self._outstanding = [0] * len(self.members)
    self._dead: set[int] = set()
    self._lock = threading.Lock()
    self._calls = 0

  @property
  def urls(self) -> list[str]:
    return [m.url for m in self.members]

  @property
  def outstanding(self) -> list[int]:
    """Requests sent to each server and not yet answered."""
    with self._lock:
      return list(self._outstanding)

  # Sampling.

  def generate(self, prompts: Sequence[Sequence[int]],
               params: SamplingParams) -> list[list[Sample]]:
    """For each prompt, `params.n` samples carrying the current policy version."""
    refused = next((m.unverified for m in self.members if m.unverified), None)
    if refused is not None:
      raise SamplerError(refused)
    self.wake_up()
    prompts = [[int(t) for t in p] for p in prompts]
    if any(not p for p in prompts):
      raise ValueError("prompts: every prompt needs at least one token")
    call, self._calls = self._calls, self._calls + 1
    version = self.policy_version
    workers = min(len(prompts), sum(m.options.max_concurrency for m in self.members)) or 1
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
      futures = [pool.submit(self._complete, p, params, seed, version)
                 for p, seed in zip(prompts, request_seeds(params, call, len(prompts)))]
      concurrent.futures.wait(futures)
    try:
      return [f.result() for f in futures]
    finally:
      self._revive()

  def _complete(self, prompt: list[int], params: SamplingParams, seed: int,
                version: int) -> list[Sample]:
    tried: set[int] = set()
    while True:
      k = self._route(tried)
      try:
        return self.members[k].complete(prompt, params, seed, version)
      except ServerUnavailable as e:
        if healthy(self.members[k].url, self.members[k].options.health_timeout_s):
          raise SamplerError(f"vLLM server {self.members[k].url} is healthy but failed the "
                             f"request: {e}") from e
        with self._lock:
          if k not in self._dead:
            _log.warning("vLLM server %s failed (%s); its requests go to the others",
                         self.members[k].url, e)
          self._dead.add(k)
          self.retried_requests += 1
        tried.add(k)
      finally:
        with self._lock:
          self._outstanding[k] -= 1

  def _route(self, tried: set[int]) -> int:
    """The live server with the fewest outstanding requests (counted as taken)."""
    with self._lock:
      live = [k for k in range(len(self.members)) if k not in self._dead and k not in tried]
      if not live:
        raise SamplerError(f"no vLLM server of the fleet answers ({self.urls})")
      k = min(live, key=lambda j: (self._outstanding[j], j))
      self._outstanding[k] += 1
      self.requests_per_member[k] += 1
      return k

  def _revive(self) -> None:
    """Restarts each server that died (once); drops those that cannot come back."""
    for k in sorted(self._dead):
      member = self.members[k]
      try:
        if member.server is None:
          raise SamplerError("attached, so not restarted")
        member.restart()
        self.restarts += 1
        self._dead.discard(k)
      except Exception as e:  # noqa: BLE001 - any failure to come back drops the server
        _log.warning("vLLM server %s dropped from the fleet: %s", member.url, e)
    if self._dead:
      keep = [k for k in range(len(self.members)) if k not in self._dead]
      for k in self._dead:
        self.members[k].close()
      self.members = [self.members[k] for k in keep]
      self.requests_per_member = [self.requests_per_member[k] for k in keep]
      self._outstanding = [0] * len(keep)
      self._dead = set()
      if not self.members:
        raise SamplerError("every vLLM server of the fleet failed")

  # Weights.

  def load_weights(self, path: str, version: Optional[int] = None,
                   teacher_logprobs: Optional[handover.TeacherLogprobs] = None
                   ) -> HandoverReport:
    """`VLLMSampler.load_weights` on every server (each checked); the slowest's report, with
    the largest gap."""
    new_version = self.policy_version + 1 if version is None else int(version)
    reports = [m.load_weights(path, new_version, teacher_logprobs) for m in self.members]
    self.policy_version = new_version
    worst = max(reports, key=lambda r: r.reload_s + r.reset_s + r.check_s)
    gaps = [r.gap for r in reports if r.gap is not None]
    gap = max(gaps, key=lambda g: g.max_abs) if gaps else None
    return HandoverReport(policy_version=new_version, weights_path=worst.weights_path,
                          reload_s=worst.reload_s, reset_s=worst.reset_s,
                          check_s=worst.check_s, gap=gap)

  def check_weights(self, teacher_logprobs: handover.TeacherLogprobs) -> handover.LogprobGap:
    gaps = [m.check_weights(teacher_logprobs) for m in self.members]
    return max(gaps, key=lambda g: g.max_abs)

  def prefix_cache(self) -> dict[str, float]:
    """The servers' prefix-cache counters, summed."""
    totals = {"queries": 0.0, "hits": 0.0}
    for m in self.members:
      for key, value in m.prefix_cache().items():
        totals[key] += value
    return totals

  def sleep(self, level: int) -> None:
    """Every server to sleep (`VLLMSampler.sleep`)."""
    for m in self.members:
      m.sleep(level)

  def wake_up(self) -> None:
    for m in self.members:
      m.wake_up()

  def close(self) -> None:
    for m in self.members:
      m.close()

  def __enter__(self) -> "VLLMFleet":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
