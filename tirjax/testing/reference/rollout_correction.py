"""Independent reference for the rollout corrections (TIS, MIS), one token and one row at a
time: lists of lists in, floats and bools out.

Written from the formulas (Ionides 2008 for truncated importance sampling; the Seq-TIS /
Seq-MIS of Liu, Li et al. 2025, "When Speed Kills Stability", as verl implements them), not
from `tirjax.loss.rollout_correction`.
"""

from __future__ import annotations

import math

from tirjax.testing.reference import loss as loss_ref

CLAMP = 20.0


def _clamp(x: float) -> float:
  return max(-CLAMP, min(CLAMP, x))


def correction(old, sampler, mask, *, is_level="off", threshold=2.0, mask_level="off", low=0.5,
               high=2.0) -> dict:
  """{"weights": [B][L] (0 off the mask), "keep": [B], "truncated": [B][L],
  "seq_log_ratio": [B]} of the correction of `old` (π_old) against `sampler` log-probs."""
  weights, keep, truncated, seqs = [], [], [], []
  for old_row, smp_row, m_row in zip(old, sampler, mask):
    deltas = [_clamp(o - s) if m else 0.0 for o, s, m in zip(old_row, smp_row, m_row)]
    n = sum(1 for m in m_row if m)
    seq = 0.0
    for d, m in zip(deltas, m_row):
      if m:
        seq += d
    seqs.append(seq)
    w_row, t_row = [], []
    for d, m in zip(deltas, m_row):
      if not m:
        w_row.append(0.0)
        t_row.append(False)
        continue
      if is_level == "token":
        x = d
      elif is_level == "sequence":
        x = seq
      else:
        w_row.append(1.0)
        t_row.append(False)
        continue
      raw = math.exp(_clamp(x))
      over = x > math.log(threshold)
      w_row.append(threshold if over else raw)
      t_row.append(over)
    weights.append(w_row)
    truncated.append(t_row)
    if mask_level == "off" or n == 0:
      keep.append(True)
    else:
      r = seq if mask_level == "sequence" else seq / n
      keep.append(math.log(low) <= r <= math.log(high))
  return {"weights": weights, "keep": keep, "truncated": truncated, "seq_log_ratio": seqs}


def corrected_pg_loss(logp, old, sampler, adv, loss_mask, row_mask, *, mode="token_mean",
                      eps_low=0.2, eps_high=0.2, norm=None, **corr) -> float:
  """The clipped surrogate with each token's term weighted by its TIS weight, aggregated over
  the loss tokens of the rows MIS keeps."""
  B, L = len(logp), len(logp[0])
  mask = [[bool(loss_mask[b][t]) and bool(row_mask[b]) for t in range(L)] for b in range(B)]
  c = correction(old, sampler, mask, **corr)
  kept = [[mask[b][t] and c["keep"][b] for t in range(L)] for b in range(B)]
  x = [[c["weights"][b][t] * loss_ref.pg(loss_ref.ratio(logp[b][t], old[b][t]), adv[b][t],
                                         eps_low, eps_high) if kept[b][t] else 0.0
        for t in range(L)] for b in range(B)]
  return loss_ref.aggregate(x, kept, mode, norm)


def quantile(values, q: float) -> float:
  """numpy's default (linear) quantile of a list; 0 for an empty one."""
  if not values:
    return 0.0
  v = sorted(values)
  pos = q * (len(v) - 1)
  lo = math.floor(pos)
  hi = min(lo + 1, len(v) - 1)
  return v[lo] + (v[hi] - v[lo]) * (pos - lo)
