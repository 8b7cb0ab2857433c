"""Reference of MT-GRPO (Zeng et al. 2025, arXiv 2505.11821; spec §4.4), with loops.

A_{j,t} = z_group(R_out)_j + λ · Â^T_{j,t}, Â^T from the turn rewards r_{j,t} by `credit`:
"immediate" z of r among the group's rows at turn t; "return_per_index" the sum over the
row's turns t' ≥ t of those z's; "return_loo" G_{j,t} minus the mean of the group's other
rows' G at turn t, G the sum of the row's raw turn rewards from t on.
"""

from __future__ import annotations

import numpy as np

from tirjax.testing.reference import stats
from tirjax.testing.reference.matching import matched_pairs
from tirjax.testing.reference.stats import groups, valid_steps, zscore_conventions


def _turn_reward(batch: dict, b: int, t: int, turn_reward: str, pairs: dict) -> float:
  if turn_reward == "format":
    return float(batch["format_reward"][b, t])
  calls = [k for k in range(batch["call_valid"].shape[2]) if batch["call_valid"][b, t, k]]
  if not calls:
    return 0.0
  return sum(pairs.get((t, k), (None, 0.0))[1] for k in calls) / len(calls)


def mt_grpo(batch: dict, credit: str = "return_loo", turn_reward: str = "match",
            coef: float = 1.0, zscore=None, matching: str = "greedy") -> dict:
  conv = zscore_conventions(zscore)
  B, T = batch["step_valid"].shape
  steps, rows = np.zeros((B, T)), np.zeros(B)
  for members in groups(batch).values():
    outcome = dict(zip(members, stats.zscore([float(batch["outcome"][b]) for b in members],
                                             **conv)))
    reward = {}
    for b in members:
      pairs = matched_pairs(batch, b, matching) if turn_reward == "match" else {}
      for t in valid_steps(batch, b):
        reward[b, t] = _turn_reward(batch, b, t, turn_reward, pairs)
    at = {}  # turn index -> the group's rows that have that turn
    for b, t in reward:
      at.setdefault(t, []).append(b)
    turn = {}
    if credit in ("immediate", "return_per_index"):
      z = {}
      for t, bs in at.items():
        z.update({(b, t): v for b, v in zip(bs, stats.zscore([reward[b, t] for b in bs],
                                                             **conv))})
      for b, t in reward:
        if credit == "immediate":
          turn[b, t] = z[b, t]
        else:
          turn[b, t] = sum(z[b, u] for u in valid_steps(batch, b) if u >= t)
    else:
      ret = {(b, t): sum(reward[b, u] for u in valid_steps(batch, b) if u >= t)
             for b, t in reward}
      for t, bs in at.items():
        values = [ret[b, t] for b in bs]
        for b in bs:
          if len(bs) == 1 or max(values) == min(values):
            turn[b, t] = 0.0
          else:
            others = [ret[k, t] for k in bs if k != b]
            turn[b, t] = ret[b, t] - sum(others) / len(others)
    for b in members:
      rows[b] = outcome[b]
      for t in valid_steps(batch, b):
        steps[b, t] = outcome[b] + coef * turn[b, t]
  return dict(steps=steps, rows=rows)


