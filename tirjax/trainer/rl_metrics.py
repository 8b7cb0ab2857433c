"""Per-step RL metrics: rewards, PORTool's four axes on the training episodes, advantage and
unlearning statistics (spec §4.1), loss diagnostics, sampler-vs-trainer log-prob gap."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from typing import Mapping, Optional, Sequence

import jax
import numpy as np

from tirjax import distributed
from tirjax.advantages.registry import Advantages
from tirjax.advantages.unlearning import unlearning_rate
from tirjax.metrics import credit
from tirjax.env import metrics as env_metrics
from tirjax.loss import rollout_correction
from tirjax.rollouts import Rollouts


def rl_metrics(r: Rollouts, adv: Advantages, step_metrics: Mapping[str, float],
               episodes: Sequence, stats: Mapping[str, float], max_steps: int,
               aggregation: str = "seq_mean_token_mean",
               first_update: Optional[Mapping[str, float]] = None) -> dict:
  """The step's metrics; `aggregation` is the loss's, which weighs each row's push on a step
  in the unlearning rate (spec §4.1). `step_metrics`: the loss's (over the step's updates);
  `first_update`: the first update's, whose ratio is the sampler-vs-trainer gap when π_old
  is the sampler's (None: no gap is logged; the trainer recomputed π_old)."""
  valid = np.asarray(r.row_valid)
  outcome = np.asarray(r.outcome)[valid]
  out = {"reward/mean": float(outcome.mean()) if outcome.size else 0.0,
         "reward/std": float(outcome.std()) if outcome.size else 0.0,
         "reward/row_reward_mean": float(np.asarray(adv.row_reward)[valid].mean())
         if outcome.size else 0.0,
         "rows/valid": int(valid.sum()), "rows/in_loss": int(np.asarray(adv.row_mask).sum())}
  out.update(signal_shares(r, adv))
  if episodes:
    axes = env_metrics.portool_metrics([e.summary for e in episodes],
                                       [e.outcome for e in episodes], step_cap=max_steps)
    out.update({"train/accuracy": axes["accuracy"], "train/avg_steps": axes["avg_tool_steps"],
                "train/unanswerable_rate": axes["unanswerable_rate"],
                "train/format_reward": axes["avg_format_reward"],
                "train/abstain_rate": axes["abstain_rate"]})
  steps = np.asarray(adv.steps)[np.asarray(r.step_valid)]
  out.update({"advantage/step_mean": float(steps.mean()) if steps.size else 0.0,
              "advantage/step_std": float(steps.std()) if steps.size else 0.0,
              "advantage/step_min": float(steps.min()) if steps.size else 0.0,
              "advantage/step_max": float(steps.max()) if steps.size else 0.0})
  u = unlearning_rate(r, adv.steps, aggregation, adv.row_mask)
  out.update({"unlearning/rate": float(u["rate"]), "unlearning/row_rate": float(u["row_rate"]),
              "unlearning/num_necessary": int(u["num_necessary"])})
  for k, v in step_metrics.items():
    out[f"loss/{k}"] = float(np.asarray(v))
  lo, hi = ((first_update or {}).get("metrics/ratio/min"),
            (first_update or {}).get("metrics/ratio/max"))
  if lo is not None and hi is not None and lo > 0 and hi > 0:
    # The first update sees the sampler's own weights: ρ = exp(trainer − sampler log-prob).
    out["sampler/logprob_gap_max"] = max(abs(math.log(lo)), abs(math.log(hi)))
  for k, v in stats.items():
    if isinstance(v, (int, float)):
      out[f"rollout/{k}"] = float(v)
  return out


_correction_metrics = jax.jit(rollout_correction.metrics, static_argnums=3)


def rollout_correction_metrics(rollouts: Rollouts, sampler_logprobs, row_mask,
                               opts: rollout_correction.RolloutCorrectionOptions) -> dict:
  """`rollout_corr/<figure>` of a step (`tirjax.loss.rollout_correction.metrics`): the gap
  |log π_old − log π_sampler| (mean, quantiles, max), the TIS weights and the share of tokens
  they truncate, the share of rows (and tokens) MIS masks, over the loss tokens of the rows
  in the loss. `rollouts.old_logprobs` is the trainer's π_old, `sampler_logprobs` the
  sampler's; every process reads the whole batch (`distributed.host_rows`), so each gets the
  batch's figures (no process combination needed)."""
  old, sampler, loss_mask, rows = (distributed.host_rows(x) for x in (
      rollouts.old_logprobs, sampler_logprobs, rollouts.loss_mask, row_mask))
  mask = loss_mask.astype(bool) & rows.astype(bool)[:, None]
  out = jax.device_get(_correction_metrics(old, sampler, mask, opts))
  return {f"rollout_corr/{k}": float(v) for k, v in out.items()}


def signal_shares(r: Rollouts, adv: Advantages) -> dict[str, float]:
  """How much of a step's batch carries a learning signal: `groups/mixed_share`, the share of
  groups (queries) whose valid rows' outcomes differ (an all-right or all-wrong group gives
  GRPO nothing), and `rows/nonzero_advantage_share`, the share of valid rows in the loss
  with a non-zero advantage on some step."""
  valid = np.asarray(r.row_valid)
  group, outcome = np.asarray(r.group_id)[valid], np.asarray(r.outcome)[valid]
  groups = np.unique(group)
  mixed = [np.ptp(outcome[group == g]) > 0 for g in groups]
  steps = np.where(np.asarray(r.step_valid), np.asarray(adv.steps), 0.0)
  pushed = (steps != 0).any(axis=1) & np.asarray(adv.row_mask).astype(bool)
  return {"groups/mixed_share": float(np.mean(mixed)) if groups.size else 0.0,
          "rows/nonzero_advantage_share": float(pushed[valid].mean()) if valid.any() else 0.0}


def credit_metrics(r: Rollouts, adv: Advantages, labels: Sequence[Optional[list]]) -> dict:
  """`credit/<measure>` (spec §4.5, `tirjax.metrics.credit`) of the step's estimator on its
  labelled turns: `r`, `adv` and `labels` are this process's rows; every process's turns are
  gathered, so all get the same figures. Undefined measures (an empty denominator) are left
  out."""
  local = credit.turn_table(r, np.asarray(adv.tokens), labels)
  parts = distributed.allgather_objects(local)
  offsets = np.cumsum([0] + [r.num_rows] * (len(parts) - 1))  # local group ids -> global
  turns = credit.concat([dataclasses.replace(t, query=t.query + o)
                         for t, o in zip(parts, offsets)])
  return {f"credit/{k}": v for k, v in credit.fidelity(turns).items() if v is not None}


class PhaseClock:
  """Wall seconds of an RL step's phases; the caller waits on each phase's device work inside
  its block (asynchronous dispatch would otherwise bill it to the next phase)."""

  def __init__(self):
    self.seconds: dict[str, float] = {}
    # this process's CPU seconds (every thread's) in the same phases: with the wall seconds,
    # how many cores a phase kept busy
    self.cpu_seconds: dict[str, float] = {}

  @contextlib.contextmanager
  def __call__(self, phase: str):
    t0, c0 = time.perf_counter(), time.process_time()
    try:
      yield
    finally:
      self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0
      self.cpu_seconds[phase] = self.cpu_seconds.get(phase, 0.0) + time.process_time() - c0

  def metrics(self, rollout_stats: Mapping[str, float]) -> dict:
    """`time/<phase>_s` for the clocked phases and, inside the rollout, the sampler's prefill
    and decode, tool execution and the judge; `tokens/prefill` and `tokens/decode`."""
    out = {f"time/{k}_s": v for k, v in self.seconds.items()}
    for key, name in (("prefill_s", "prefill"), ("decode_s", "decode"), ("env_s", "tools"),
                      ("judge_s", "judge"), ("sampler_s", "sampler")):
      if key in rollout_stats:
        out[f"time/{name}_s"] = float(rollout_stats[key])
    for key, name in (("prefill_tokens", "prefill"), ("decode_tokens", "decode")):
      if key in rollout_stats:
        out[f"tokens/{name}"] = float(rollout_stats[key])
    return out
