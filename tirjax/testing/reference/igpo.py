"""Reference of IGPO (Wang et al. 2025, arXiv 2510.14967; spec §4.4), with loops.

r_{i,t} = P(a | history through turn t) − P(a | history before it), P = exp(answer_logprob),
for every turn but the row's last, whose reward is the final reward; the rewards are z-scored
over the group's turns ("group") or over the group's rows at one turn index ("turn_index");
A_{i,t} = Σ_{k ≥ t} γ^{k−t} r̃_{i,k}.
"""

from __future__ import annotations

import math

import numpy as np

from tirjax.testing.reference import stats
from tirjax.testing.reference.stats import groups, valid_steps, zscore_conventions


def igpo(batch: dict, gamma: float = 1.0, normalise: str = "group",
         final_reward: str = "outcome", zscore=None) -> dict:
  conv = zscore_conventions(zscore)
  B, T = batch["step_valid"].shape
  lp = batch["answer_logprob"]
  steps, rows = np.zeros((B, T)), np.zeros(B)
  for members in groups(batch).values():
    reward = {}
    for b in members:
      ts = valid_steps(batch, b)
      for t in ts:
        if t == ts[-1]:
          key = "outcome" if final_reward == "outcome" else "answer_score"
          reward[b, t] = float(batch[key][b])
        else:
          reward[b, t] = math.exp(float(lp[b, t + 1])) - math.exp(float(lp[b, t]))
    pools = {}  # pool key -> the (row, step) pairs z-scored together
    for b, t in reward:
      pools.setdefault(0 if normalise == "group" else t, []).append((b, t))
    norm = {}
    for keys in pools.values():
      norm.update(zip(keys, stats.zscore([reward[k] for k in keys], **conv)))
    for b in members:
      ts = valid_steps(batch, b)
      for t in ts:
        steps[b, t] = sum(gamma ** (k - t) * norm[b, k] for k in ts if k >= t)
      rows[b] = steps[b, ts[0]] if ts else 0.0
  return dict(steps=steps, rows=rows)
