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

Checkpoints. A checkpoint after step t holds θ_{t+1} but not the queued rollouts of steps
t + 1 … t + k, which older weights sampled; they are lost with the process, and resuming a
k >= 1 run from inside its RL phase is refused with an error naming the option (a restart
from the hand-over to RL, or after the last step, needs no queue and is allowed). A bit-exact
resume would save the queue with the checkpoint; it is not built.

Not built, refused by `resolve`: several trainer processes, the vLLM sampler, an estimator
with a critic, IGPO's answer probes; and the overlap of sampling with the update (a thread
or process that samples step t + k while step t trains) — this mode runs them in turn.
"""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

import numpy as np

from tirjax.rollouts import Rollouts

Batch = TypeVar("Batch")


class SampleQueue(Generic[Batch]):
  """The sampled steps not yet trained on, by step; `take` samples ahead and pops one."""

  def __init__(self, k: int):
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
      raise ValueError(f"max_staleness: a queue needs an integer k >= 1, got {k!r}")
    self.k = k
    self.batches: dict[int, Batch] = {}

  def take(self, step: int, steps: int, sample: Callable[[int], Batch]) -> Batch:
    """Step `step`'s batch, after sampling (with the weights the sampler now holds, θ_step)
    every step from the queue's next one to min(step + k, steps − 1) in order: steps
    0 … k at step 0, step + k after."""
    if not 0 <= step < steps:
      raise ValueError(f"step {step} outside the run's RL steps [0, {steps})")
    if self.batches and step != min(self.batches):
      raise ValueError(f"step {step}: the queue holds steps {sorted(self.batches)} (steps are "
                       "taken in order, none skipped)")
    start = max(self.batches, default=step - 1) + 1
    for j in range(start, min(step + self.k, steps - 1) + 1):
      self.batches[j] = sample(j)
    return self.batches.pop(step)


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


def refuse_resume(k: int, rl_step: int, steps: int) -> None:
  """Raises where a k >= 1 run would resume inside its RL phase: its queued rollouts, sampled
  by older weights, were not checkpointed (see the module docstring)."""
  if k >= 1 and 0 < rl_step < steps:
    raise RuntimeError(
        f"train.max_staleness={k}: cannot resume at RL step {rl_step} of {steps}: the rollouts "
        f"queued for steps {rl_step} … {min(rl_step + k, steps) - 1}, sampled by older weights, "
        "are not saved with the checkpoint; restart the run in a new directory, or finish it "
        "with train.max_staleness=0 (the run dir and its checkpoints are left as they are)")
