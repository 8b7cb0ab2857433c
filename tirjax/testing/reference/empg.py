"""Reference of EMPG (Wang et al. 2025, arXiv 2509.09265; spec §4.4), written from the paper's
equations and the choices of tirjax/advantages/empg.py's docstring, with loops over rows,
steps and tokens."""

from __future__ import annotations

import math

import numpy as np

from tirjax.testing.reference import stats
from tirjax.testing.reference.stats import groups, valid_steps, zscore_conventions


def _step_surprisals(batch: dict) -> dict[tuple[int, int], float]:
  """(row, step) -> mean of −old_logprob over the step's loss tokens, steps with tokens only."""
  tokens: dict[tuple[int, int], list[float]] = {}
  for rows in groups(batch).values():
    for b in rows:
      for i in range(batch["loss_mask"].shape[1]):
        if batch["loss_mask"][b, i]:
          key = (b, int(batch["token_step"][b, i]))
          tokens.setdefault(key, []).append(-float(batch["old_logprobs"][b, i]))
  return {key: sum(v) / len(v) for key, v in tokens.items()}


def empg(batch: dict, k: float = 1.0, k_f: float = 1.0, zeta: float = 0.1, center: bool = True,
         zscore=None) -> dict:
  """A_t = g(H_t) · A_row + ζ · f(H_{t+1}), then minus the mean over scored steps."""
  conv = zscore_conventions(zscore)
  row_adv = {}
  for rows in groups(batch).values():
    row_adv.update(zip(rows, stats.zscore([float(batch["outcome"][b]) for b in rows], **conv)))
  h = _step_surprisals(batch)
  lo, hi = (min(h.values()), max(h.values())) if h else (0.0, 0.0)
  h_norm = {key: (v - lo) / (hi - lo + 1e-8) for key, v in h.items()}
  raw = {key: math.exp(-k * v) for key, v in h_norm.items()}
  mean_raw = sum(raw.values()) / len(raw) if raw else 0.0
  B, T = batch["step_valid"].shape
  steps, rows_out = np.zeros((B, T)), np.zeros(B)
  for b, a in row_adv.items():
    rows_out[b] = a
    for t in valid_steps(batch, b):
      g = raw[(b, t)] / (mean_raw + 1e-8) if (b, t) in raw else 1.0
      bonus = math.exp(-k_f * h_norm[(b, t + 1)]) if (b, t + 1) in h_norm else 0.0
      steps[b, t] = g * a + zeta * bonus
  if center and h:
    mean = sum(steps[b, t] for b, t in h) / len(h)
    for b, a in row_adv.items():
      for t in valid_steps(batch, b):
        steps[b, t] -= mean
  return dict(steps=steps, rows=rows_out)


