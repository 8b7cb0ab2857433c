"""Reference of HGPO (He et al. 2026, arXiv 2602.22817; spec §4.4), written from the paper's
nested groups and the conventions of tirjax/advantages/hgpo.py's docstring, with dicts keyed
by the observations' token tuples themselves (the kernel hashes them)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from tirjax.testing.reference import stats
from tirjax.testing.reference.stats import groups, valid_steps, zscore_conventions


def observations(batch: dict, b: int) -> dict[int, tuple]:
  """Step t -> the tokens shown before it: real tokens outside the loss after step t−1's
  generated tokens (the prompt for t = 0)."""
  out: dict[int, list] = defaultdict(list)
  last = -1
  for i in range(batch["tokens"].shape[1]):
    if not batch["token_valid"][b, i]:
      break
    if batch["loss_mask"][b, i]:
      last = max(last, int(batch["token_step"][b, i]))
    else:
      out[last + 1].append(int(batch["tokens"][b, i]))
  return {t: tuple(v) for t, v in out.items()}


def hgpo(batch: dict, gamma: float = 0.95, history: int = 2, alpha: float = 1.0, zscore=None,
         episode_weight: float = 0.0, drop_zero_levels: bool = False) -> dict:
  """A(s) = λ_E · A^E + Σ_k w_k A_k(s) / Σ_k w_k, w_k = (k + 1)^α, over the levels k <= K
  whose group (same query, same observation and k previous observations) has >= 2 steps."""
  conv = zscore_conventions(zscore, scale="none")
  B, T = batch["step_valid"].shape
  steps, rows_out = np.zeros((B, T)), np.zeros(B)
  for g, rows in groups(batch).items():
    episode = dict(zip(rows, stats.zscore([float(batch["outcome"][b]) for b in rows])))
    members = defaultdict(list)  # (level, key) -> [(row, step, return)]
    for b in rows:
      obs = observations(batch, b)
      n, outcome = int(batch["num_steps"][b]), float(batch["outcome"][b])
      for t in valid_steps(batch, b):
        ret = gamma ** (n - (t + 1)) * outcome
        for k in range(0, min(history, t) + 1):
          key = tuple(obs.get(t - j, ()) for j in range(k + 1))
          members[(k, key)].append((b, t, ret))
    per_step = defaultdict(list)  # (row, step) -> [(weight, advantage)]
    for (k, _), group in members.items():
      if len(group) < 2:
        continue
      for (b, t, _), a in zip(group, stats.zscore([x for _, _, x in group], **conv)):
        if not (drop_zero_levels and a == 0):
          per_step[(b, t)].append(((k + 1) ** alpha, a))
    for b in rows:
      rows_out[b] = episode_weight * episode[b]
      for t in valid_steps(batch, b):
        parts = per_step.get((b, t), [])
        den = sum(w for w, _ in parts)
        step = sum(w * a for w, a in parts) / den if den > 0 else 0.0
        steps[b, t] = episode_weight * episode[b] + step
  return dict(steps=steps, rows=rows_out)


