"""References of verl's outcome-level estimators (spec §4.4), from their papers, with loops.

reinforce_plus_plus and reinforce_plus_plus_baseline (Hu 2025), remax (Li et al. 2023), opo
(Hao et al. 2025), gpg (Chu et al. 2025), grpo_passk (Tang et al. 2025, arXiv 2503.19595). The
token-level two also return `tokens` [B, L]; their step value is the mean of the step's token advantages and
their row value the mean of the row's.
"""

from __future__ import annotations

import math

import numpy as np

from tirjax.testing.reference import stats
from tirjax.testing.reference.group import _result
from tirjax.testing.reference.stats import groups, zscore_conventions


_generated = stats.generated


def _whitened_tokens(batch: dict, value_at, conv: dict) -> dict:
  """The z-score of value_at(b, position) over every generated token of the batch as one
  group; steps and rows as the means of their tokens."""
  B, L = batch["loss_mask"].shape
  positions = [(b, i) for b in range(B) for i in _generated(batch, b)]
  z = stats.zscore([value_at(b, i) for b, i in positions], **conv)
  tokens = np.zeros((B, L))
  for (b, i), v in zip(positions, z):
    tokens[b, i] = v
  return stats.token_means(batch, tokens)


def reinforce_plus_plus(batch: dict, gamma: float = 1.0, zscore=None) -> dict:
  """G_t = Σ_{k ≥ t} γ^(k−t) r_k over the row's generated tokens, r = R_out on the last one
  and 0 elsewhere; then whitened over the batch's generated tokens."""
  returns = {}
  for b in range(batch["row_valid"].shape[0]):
    mine = _generated(batch, b)
    running = 0.0
    for k, i in enumerate(reversed(mine)):
      reward = float(batch["outcome"][b]) if k == 0 else 0.0
      running = reward + gamma * running
      returns[(b, i)] = running
  return _whitened_tokens(batch, lambda b, i: returns[(b, i)], zscore_conventions(zscore))


def reinforce_plus_plus_baseline(batch: dict, group=None, whiten=None) -> dict:
  """R_out − mean of the group (a group of one: 0, or R_out with singleton "raw"; all equal:
  0), on every generated token of the row, then whitened over the batch's tokens."""
  conv = zscore_conventions(group, scale="none")
  dev = {}
  for rows in groups(batch).values():
    for b, d in zip(rows, stats.zscore([float(batch["outcome"][b]) for b in rows], **conv)):
      dev[b] = d
  return _whitened_tokens(batch, lambda b, i: dev[b], zscore_conventions(whiten))


def remax(batch: dict) -> dict:
  """R_out − the R_out of the query's greedy rollout."""
  return _result(batch, {b: float(batch["outcome"][b]) - float(batch["greedy_outcome"][b])
                         for rows in groups(batch).values() for b in rows})


def _degenerate(rewards: list[float], singleton: str):
  """spec §3: the advantages of a group of one or of equal rewards, else None."""
  if len(rewards) == 1:
    return [rewards[0] if singleton == "raw" else 0.0]
  if max(rewards) == min(rewards):
    return [0.0] * len(rewards)
  return None


def opo(batch: dict, singleton: str = "zero") -> dict:
  """R_out − Σ|τ|R / Σ|τ| over the group, |τ| the row's generated tokens (plain mean when no
  row of the group generated a token)."""
  adv = {}
  for rows in groups(batch).values():
    rewards = [float(batch["outcome"][b]) for b in rows]
    lengths = [len(_generated(batch, b)) for b in rows]
    out = _degenerate(rewards, singleton)
    if out is None:
      total = sum(lengths)
      base = (sum(n * r for n, r in zip(lengths, rewards)) / total if total
              else sum(rewards) / len(rewards))
      out = [r - base for r in rewards]
    adv.update(zip(rows, out))
  return _result(batch, adv)


def gpg(batch: dict, singleton: str = "zero", valid_rows: str = "varied_groups") -> dict:
  """α (R_out − group mean), α = (valid rows) / (rows that count): rows of groups of two or
  more unequal rewards ("varied_groups"), or rows with R_out ≠ 0 ("nonzero_reward")."""
  by_group = groups(batch)
  num_rows = sum(len(rows) for rows in by_group.values())
  counted = 0
  for rows in by_group.values():
    rewards = [float(batch["outcome"][b]) for b in rows]
    if valid_rows == "nonzero_reward":
      counted += sum(r != 0 for r in rewards)
    elif _degenerate(rewards, "zero") is None:
      counted += len(rows)
  alpha = num_rows / counted if counted else 0.0
  adv = {}
  for rows in by_group.values():
    rewards = [float(batch["outcome"][b]) for b in rows]
    out = _degenerate(rewards, singleton)
    if out is None:
      out = [r - sum(rewards) / len(rewards) for r in rewards]
    adv.update((b, alpha * a) for b, a in zip(rows, out))
  return _result(batch, adv)


def grpo_passk(batch: dict, zscore=None) -> dict:
  """The group's first row of maximal R_out gets (R_max − the best other R)/(std + eps);
  every other row 0."""
  conv = zscore_conventions(zscore)
  adv = {}
  for rows in groups(batch).values():
    rewards = [float(batch["outcome"][b]) for b in rows]
    out = _degenerate(rewards, conv["singleton"])
    if out is None:
      best = rewards.index(max(rewards))
      margin = rewards[best] - max(r for k, r in enumerate(rewards) if k != best)
      if conv["scale"] == "std":
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / max(len(rewards) - conv["ddof"], 1))
        margin /= std + conv["eps"]
      out = [margin if k == best else 0.0 for k in range(len(rows))]
    adv.update(zip(rows, out))
  return _result(batch, adv)
