"""References of verl's optimal token baselines and GDPO (spec §4.4), with loops.

optimal_token_baseline and tir_optimal_token_baseline (verl docs/algo/otb.md): per query and
position, B = Σ G·W / Σ W over the rows that have a generated token there; gdpo (Liu et al.
2026, arXiv 2601.05242): each reward z-scored within its group, summed with weights,
normalised over the batch. The OTB references return `tokens` [B, L] too; their step value is
the mean of the step's token advantages and their row value the mean of the row's.
"""

from __future__ import annotations

import math

import numpy as np

from tirjax.testing.reference import stats
from tirjax.testing.reference.group import _result
from tirjax.testing.reference.stats import groups, valid_steps, zscore_conventions


_generated = stats.generated


def _energy(batch: dict, b: int, i: int, energy: str) -> float:
  pi = math.exp(float(batch["old_logprobs"][b, i]))
  if energy == "sum_pi_squared":
    w = 1.0 - 2.0 * pi + float(batch["sum_pi_squared"][b, i])
  else:
    w = 1.0 - pi
  return max(w, 0.0)


def _otb(batch: dict, align: str, energy: str, singleton: str, zero_tail: bool,
         eps: float) -> dict:
  B, L = batch["loss_mask"].shape
  tokens = np.zeros((B, L))
  for rows in groups(batch).values():
    # Each row's generated tokens as (position, column, W_p), positions by `align`.
    layout = {}
    for b in rows:
      mine = _generated(batch, b)
      running, entries = 0.0, []
      for k, i in enumerate(mine):
        running += _energy(batch, b, i, energy)
        entries.append((k if align == "generated" else i - mine[0], i, running))
      layout[b] = entries
    members = [b for b in rows if layout[b] or align == "response"]
    if len(members) == 1:
      b = members[0]
      for _, i, _ in layout[b]:
        tokens[b, i] = float(batch["outcome"][b]) if singleton == "raw" else 0.0
      continue
    by_position = {}
    for b in members:
      for p, i, w in layout[b]:
        by_position.setdefault(p, []).append((b, i, w))
    lengths = {b: (layout[b][-1][0] + 1 if layout[b] else 0) for b in members}
    tail_row, tail_from = None, None
    if zero_tail:
      ordered = sorted(lengths.values())
      longest = [b for b in members if lengths[b] == ordered[-1]]
      if len(longest) == 1 and ordered[-1] > ordered[-2]:
        tail_row, tail_from = longest[0], ordered[-2]
    for p, entries in by_position.items():
      returns = [float(batch["outcome"][b]) for b, _, _ in entries]
      total = sum(w for _, _, w in entries) + eps
      if total > 0:
        base = sum(g * w for g, (_, _, w) in zip(returns, entries)) / total
      else:
        base = sum(returns) / len(returns)
      for g, (b, i, _) in zip(returns, entries):
        if b == tail_row and p >= tail_from:
          tokens[b, i] = g
        elif max(returns) == min(returns):
          tokens[b, i] = 0.0
        else:
          tokens[b, i] = g - base
  return stats.token_means(batch, tokens)


def optimal_token_baseline(batch: dict, energy: str = "sampled", singleton: str = "zero",
                           zero_tail: bool = False, eps: float = 0.0) -> dict:
  """Positions from the row's first generated token, tool-response tokens counted; every
  valid row belongs to its group."""
  return _otb(batch, "response", energy, singleton, zero_tail, eps)


def tir_optimal_token_baseline(batch: dict, energy: str = "sampled", singleton: str = "zero",
                               zero_tail: bool = False, eps: float = 0.0) -> dict:
  """Positions over generated tokens only; rows without generated tokens are in no group."""
  return _otb(batch, "generated", energy, singleton, zero_tail, eps)


def _row_reward(batch: dict, b: int, name: str) -> float:
  if name == "outcome":
    return float(batch["outcome"][b])
  if name == "answer_score":
    return float(batch["answer_score"][b])
  fm = [float(batch["format_reward"][b, t]) for t in valid_steps(batch, b)]
  return sum(fm) / len(fm) if fm else 0.0


def gdpo(batch: dict, rewards=("outcome", "format"), weights=None, zscore=None,
         batch_norm: str = "rows", whiten=None) -> dict:
  """Σ_k w_k z_group(r_k), then z-scored over the batch's rows ("rows"), over its generated
  tokens ("tokens"), or left ("none")."""
  weights = weights if weights is not None else (1.0,) * len(rewards)
  conv, wconv = zscore_conventions(zscore), zscore_conventions(whiten)
  total = {}
  for rows in groups(batch).values():
    for b in rows:
      total[b] = 0.0
    for name, w in zip(rewards, weights):
      z = stats.zscore([_row_reward(batch, b, name) for b in rows], **conv)
      for b, v in zip(rows, z):
        total[b] += w * v
  rows = sorted(total)
  if batch_norm == "none":
    return _result(batch, total)
  if batch_norm == "rows":
    adv = dict(zip(rows, _batch_zscore([total[b] for b in rows], wconv)))
    return _result(batch, adv)
  B, L = batch["loss_mask"].shape
  positions = [(b, i) for b in rows for i in _generated(batch, b)]
  z = _batch_zscore([total[b] for b, _ in positions], wconv)
  tokens = np.zeros((B, L))
  for (b, i), v in zip(positions, z):
    tokens[b, i] = v
  return stats.token_means(batch, tokens)


def _batch_zscore(values: list[float], conv: dict) -> list[float]:
  """The batch step: a z-score whose values count as all equal (0) when their spread is at
  most eps · max(1, |largest|), so that sums made of eps terms are not blown up."""
  if values and max(values) - min(values) <= conv["eps"] * max(1.0, *(abs(v) for v in values)):
    return [0.0] * len(values)
  return stats.zscore(values, **conv)


