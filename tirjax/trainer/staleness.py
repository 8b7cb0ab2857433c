"""k-step off-policy rollouts (`train.max_staleness = k`), the deterministic mode.

Schedule. RL step t trains on rollouts sampled by the weights θ_s of step s = max(t − k, 0)
(θ_s: the state as step s starts, after s updates; θ_0 the warm start's). The trainer keeps
the next sampled steps in a queue (`SampleQueue`): at step t it hands the sampler θ_t, samples
step t + k (and at t = 0 steps 0 … k, all with θ_0), then trains on step t, popped from the
queue. Each step's sampling rng is seeded by (seed, step) alone (`stages.sample`), and the
sampling runs in this order whatever the timing, so a seeded run is reproducible. With k = 0
the trainer does not build a queue: the loop samples step t with θ_t, as it always did.

Every row carries the version of the policy that sampled it (`Rollouts.policy_version`: the
oldest of its turns' `StepNode.policy_version`); a row's staleness is the trainer's version
minus its own, logged per step as `staleness/mean` and `staleness/max` (0 at k = 0; min(t, k)
at step t otherwise, a warm-up step of a critic aside, which is not built here).

Objective (the decoupled PPO objective of AReaL, Fu et al. 2025, arXiv 2505.24298). With
π_behav the policy that sampled a token (θ_s above), π_prox the proximal policy that the
trainer recomputes with its current weights θ_t before the step's first update, and π_θ the
policy being updated, each loss token contributes

    w_t · min(u_t A_t, clip(u_t, 1 − ε_low, 1 + ε_high) A_t),
    u_t = π_θ(y_t) / π_prox(y_t),     w_t = min(π_prox(y_t) / π_behav(y_t), C)

(negated, and aggregated as `loss.aggregation` says). The clip keeps each update near the
recent π_prox instead of near a policy k versions old, and w_t moves the expectation from
π_behav's samples to π_prox's. This is the token-level rollout correction that the trainer
already has (`tirjax.loss.rollout_correction`, TIS): π_old := π_prox (the recomputed
log-probs, `stages` `own_logprobs`) and π_sampler := π_behav (the rows' log-probs as sampled,
each by its own version). So k >= 1 requires `loss.rollout_correction.is_level = "token"`
(refused otherwise, not switched on behind the user's back); C is its `is_threshold` (AReaL
leaves the weight uncapped; C = ∞ is not offered here, a large C comes close), and MIS
(`mask_level`) may be combined with it. At k = 0 the same correction measures only the
sampler–trainer gap. The weights' distribution is logged per step as `rollout_corr/*`
(`weight_mean`, `weight_min`, `weight_max`, `truncated_token_share`, the gap's quantiles).

Checkpoints. A checkpoint after step t holds θ_{t+1}, not the weights θ_{t+1−k} … θ_t that
sampled the queued rollouts of steps t + 1 … t + k. So the queue is saved beside it: before
the checkpoint of train step n is handed to the checkpointer, the queued batches (arrays
fetched to the host) are written to `staleness_queue/<n>.pkl` in the run directory (a
SHA-256 of the payload first, written to a temporary name and renamed into place), so a
committed checkpoint always has its queue. A resume inside RL loads the queue of the
checkpoint it restored and trains on those rows: the run goes on as the uninterrupted one
would, bit for bit. A queue file missing or failing its checksum stops the resume with an
error that names it (nothing is re-sampled with the wrong weights, nothing deleted); queue
files of checkpoints the checkpointer has deleted are deleted with them.

Overlap. The steps sampled ahead (t + 1 … t + k) are sampled by one background thread while
step t's advantages, reference passes and update run (`SampleQueue(k, ahead=True)`, the
trainer's). Only the step being trained is ever sampled in the learner's thread: step 0 at
the start. The sampler holds θ_t until every step sampled ahead with it is in
(`SampleQueue.settle`), which the loop calls before anything else touches the sampler: the
next hand-over, an evaluation (it hands the sampler the new weights) and a checkpoint (whose
queue file must hold them). A thread, not a process: JAX's computations release the GIL, the
sampler's compiled programs and its weights are shared rather than copied, and the hand-over
stays a reference swap. Since every step is sampled with the same weights, in the same order,
from the same rng, as without the thread, the run is the same bit for bit
(tests/test_staleness.py); only the wall time differs. The learner's wait for rows
(`time/wait_rollouts_s`), the thread's sampling seconds (`time/sample_ahead_s`) and its wait
for the next weights (`time/sampler_wait_weights_s`) are logged per step.

Not built, refused by `resolve`: several trainer processes, the vLLM sampler, an estimator
with a critic, IGPO's answer probes; partial rollouts (an episode that goes on under newer
weights): the deterministic mode samples each step with one version, and a row's episodes
would otherwise need per-token versions that the correction reads per row today.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import os
import pickle
import time
from typing import Callable, Generic, Optional, TypeVar

import jax
import numpy as np

from tirjax.rollouts import Rollouts

Batch = TypeVar("Batch")


class SampleQueue(Generic[Batch]):
  """The sampled steps not yet trained on, by step; `take` samples ahead and pops one.

  With `ahead` (the trainer's), the steps after the one taken are sampled by one background
  thread, in order; `settle` waits for them. Without it they are sampled in the caller's
  thread, in the same order: the same batches, later (a test compares the two).
  """

  def __init__(self, k: int, ahead: bool = False):
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
      raise ValueError(f"max_staleness: a queue needs an integer k >= 1, got {k!r}")
    self.k = k
    self.batches: dict[int, Batch] = {}
    self._pending: dict[int, concurrent.futures.Future] = {}
    self._pool = (concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tirjax-sample")
                  if ahead else None)
    self._clock = {"wait": 0.0, "ahead": 0.0, "idle": 0.0}
    self._finished: Optional[float] = None  # when the thread's last sampling ended

  def take(self, step: int, steps: int, sample: Callable[[int], Batch]) -> Batch:
    """Step `step`'s batch, after starting to sample (with the weights the sampler now holds,
    θ_step) every step from the queue's next one to min(step + k, steps − 1) in order:
    steps 0 … k at step 0, step + k after. Only `step` itself is waited for."""
    if not 0 <= step < steps:
      raise ValueError(f"step {step} outside the run's RL steps [0, {steps})")
    self.settle()
    if self.batches and step != min(self.batches):
      raise ValueError(f"step {step}: the queue holds steps {sorted(self.batches)} (steps are "
                       "taken in order, none skipped)")
    start = max(self.batches, default=step - 1) + 1
    for j in range(start, min(step + self.k, steps - 1) + 1):
      if j == step or self._pool is None:
        self.batches[j] = sample(j)
      else:
        if self._finished is not None:  # the sampler waited for θ_step since then
          self._clock["idle"] += time.perf_counter() - self._finished
          self._finished = None
        self._pending[j] = self._pool.submit(self._timed, sample, j)
    return self.batches.pop(step)

  def _timed(self, sample: Callable[[int], Batch], j: int) -> Batch:
    start = time.perf_counter()
    try:
      return sample(j)
    finally:
      self._finished = time.perf_counter()
      self._clock["ahead"] += self._finished - start

  def settle(self) -> None:
    """Waits until every step being sampled ahead is in `batches` (re-raising a sampling
    error here); after it, the sampler is the caller's until the next `take`."""
    start = time.perf_counter()
    try:
      for j in sorted(self._pending):
        self.batches[j] = self._pending.pop(j).result()
    finally:
      self._clock["wait"] += time.perf_counter() - start

  def seconds(self) -> dict:
    """Seconds since the last call: `time/wait_rollouts_s` (the caller waited in `settle`),
    `time/sample_ahead_s` (the thread sampled) and `time/sampler_wait_weights_s` (the thread
    had sampled all it could and waited for the next weights)."""
    out = {"time/wait_rollouts_s": self._clock["wait"],
           "time/sample_ahead_s": self._clock["ahead"],
           "time/sampler_wait_weights_s": self._clock["idle"]}
    self._clock = dict.fromkeys(self._clock, 0.0)
    return out

  def close(self) -> None:
    """Waits for a sampling in flight (the sampler is closed after it) and ends the thread;
    steps queued and not started are dropped."""
    if self._pool is not None:
      self._pool.shutdown(wait=True, cancel_futures=True)
    self._pending.clear()


def row_staleness(version: int, rollouts: Rollouts) -> np.ndarray:
  """version − policy_version of each valid row: how many policy versions behind the
  trainer's (`version`) the weights that sampled it are. [valid rows], int."""
  valid = np.asarray(rollouts.row_valid, bool)
  return int(version) - np.asarray(rollouts.policy_version)[valid].astype(np.int64)


def staleness_metrics(version: int, rollouts: Rollouts) -> dict:
  """`staleness/mean` and `staleness/max` over the batch's valid rows (0 without any)."""
  s = row_staleness(version, rollouts)
  return {"staleness/mean": float(s.mean()) if s.size else 0.0,
          "staleness/max": int(s.max()) if s.size else 0}


QUEUE_DIR = "staleness_queue"


def queue_path(workdir: str, step: int) -> str:
  """The file of the queue saved with the checkpoint of train step `step`."""
  return os.path.join(workdir, QUEUE_DIR, f"{int(step)}.pkl")


def save_queue(workdir: str, step: int, batches: dict) -> None:
  """Writes `batches` (step -> StepBatch) for the checkpoint of train step `step`: its
  SHA-256, a newline, the pickled batches with their arrays on the host; atomically."""
  host = {j: dataclasses.replace(b, rollouts=jax.device_get(b.rollouts),
                                 local=jax.device_get(b.local)) for j, b in batches.items()}
  payload = pickle.dumps(host, protocol=pickle.HIGHEST_PROTOCOL)
  path = queue_path(workdir, step)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = f"{path}.tmp"
  with open(tmp, "wb") as f:
    f.write(hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def load_queue(workdir: str, step: int, k: int) -> dict:
  """The queue saved with the checkpoint of train step `step`; raises, naming the file,
  where it is missing or fails its checksum."""
  path = queue_path(workdir, step)
  why = (f"train.max_staleness={k}: cannot resume inside RL without the rollouts queued at "
         "the checkpoint, which older weights sampled")
  if not os.path.exists(path):
    raise RuntimeError(f"{why}: {path} is missing (the run dir is left as it is)")
  with open(path, "rb") as f:
    digest, _, payload = f.read().partition(b"\n")
  if hashlib.sha256(payload).hexdigest().encode() != digest:
    raise RuntimeError(f"{why}: {path} fails its checksum (the run dir is left as it is)")
  return pickle.loads(payload)


def prune_queues(workdir: str, kept: list[int], below: int) -> None:
  """Deletes the queue files of checkpoints below train step `below` that are not in `kept`
  (the checkpointer deleted them); the newest, whose save may be in flight, stays."""
  folder = os.path.join(workdir, QUEUE_DIR)
  for name in os.listdir(folder) if os.path.isdir(folder) else ():
    stem = name.removesuffix(".pkl")
    if name.endswith(".pkl") and stem.isdigit() and int(stem) < below and int(stem) not in kept:
      os.remove(os.path.join(folder, name))


def check_resumable(workdir: str, k: int, step: int, rl_step: int, steps: int) -> None:
  """Raises where a k >= 1 run would resume inside its RL phase (0 < `rl_step` < `steps`)
  from the checkpoint of train step `step` without its saved queue."""
  if k >= 1 and 0 < rl_step < steps and not os.path.exists(queue_path(workdir, step)):
    raise RuntimeError(
        f"train.max_staleness={k}: cannot resume at RL step {rl_step} of {steps}: the rollouts "
        f"queued at its checkpoint, sampled by older weights, are not in "
        f"{queue_path(workdir, step)} (the run dir is left as it is)")
