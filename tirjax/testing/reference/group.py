"""References of the outcome-level baselines grpo, grpo_fm, dr_grpo, rloo, dapo (spec §4.3).

Written from the spec and the cited papers with loops over groups and rows.
"""

from __future__ import annotations

import numpy as np

from tirjax.testing.reference import stats
from tirjax.testing.reference.stats import groups, valid_steps, zscore_conventions


def _result(batch: dict, row_adv: dict[int, float]) -> dict:
  """Row advantages broadcast to the row's valid steps; rows without an entry get 0."""
  B, T = batch["step_valid"].shape
  rows, steps = np.zeros(B), np.zeros((B, T))
  for b, a in row_adv.items():
    rows[b] = a
    for t in valid_steps(batch, b):
      steps[b, t] = a
  return dict(steps=steps, rows=rows)


def _grouped(batch: dict, reward: dict[int, float], conv: dict) -> dict[int, float]:
  out = {}
  for rows in groups(batch).values():
    for b, z in zip(rows, stats.zscore([reward[b] for b in rows], **conv)):
      out[b] = z
  return out


def _outcomes(batch: dict) -> dict[int, float]:
  return {b: float(batch["outcome"][b]) for rows in groups(batch).values() for b in rows}


def grpo(batch: dict, zscore=None) -> dict:
  """A_j = z-score of R_out_j within its group."""
  return _result(batch, _grouped(batch, _outcomes(batch), zscore_conventions(zscore)))


def grpo_fm(batch: dict, zscore=None) -> dict:
  """A_j = z-score of R_out_j + (1/T_j) Σ_t R_fm(s_{j,t}) (0 for a row without steps)."""
  reward, outcomes = {}, _outcomes(batch)
  for b, out in outcomes.items():
    fm = [float(batch["format_reward"][b, t]) for t in valid_steps(batch, b)]
    reward[b] = out + (sum(fm) / len(fm) if fm else 0.0)
  return _result(batch, _grouped(batch, reward, zscore_conventions(zscore)))


def dr_grpo(batch: dict, zscore=None) -> dict:
  """A_j = R_out_j − mean of the group (Dr. GRPO's default: no std scaling)."""
  conv = zscore_conventions(zscore, scale="none")
  return _result(batch, _grouped(batch, _outcomes(batch), conv))


def rloo(batch: dict, singleton: str = "zero") -> dict:
  """A_j = R_j − mean_{k ≠ j} R_k; a row alone in its group gets 0 (or R_j with "raw")."""
  adv = {}
  for rows in groups(batch).values():
    for b in rows:
      others = [float(batch["outcome"][k]) for k in rows if k != b]
      r = float(batch["outcome"][b])
      adv[b] = r - sum(others) / len(others) if others else (r if singleton == "raw" else 0.0)
  return _result(batch, adv)


def dapo(batch: dict, zscore=None, dynamic_sampling: bool = True, overlong_shaping: bool = True,
         max_response_tokens: int = 20480, overlong_cache: int = 4096) -> dict:
  """GRPO on R_out + the soft overlong penalty; groups where every row or no row is correct
  (R_out = +1) are masked to 0 (DAPO's Eq. 11 counts correct answers, not shaped rewards)."""
  reward, outcomes = {}, _outcomes(batch)
  for b, out in outcomes.items():
    penalty = 0.0
    if overlong_shaping:
      length = int(np.sum(batch["loss_mask"][b]))
      start = max_response_tokens - overlong_cache
      if length > max_response_tokens:
        penalty = -1.0
      elif length > start:
        penalty = (start - length) / overlong_cache
    reward[b] = out + penalty
  adv = _grouped(batch, reward, zscore_conventions(zscore))
  if dynamic_sampling:
    for rows in groups(batch).values():
      num_correct = sum(outcomes[b] > 0 for b in rows)
      if num_correct in (0, len(rows)):
        for b in rows:
          adv[b] = 0.0
  return _result(batch, adv)
