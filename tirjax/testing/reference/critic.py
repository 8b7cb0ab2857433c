"""References of PPO's critic-based estimators and of the clipped value loss, with loops.

`ppo` (token-level GAE) and `turn_ppo` (turn-level GAE, Turn-PPO arXiv 2512.17008) from their
definitions (`tirjax/advantages/critic.py`'s docstring): each row's loss tokens (or turns) are
listed, the GAE recursion runs backwards over the list, a shared tree prefix reads the values
of its lowest row and (with `shared_prefix="mean"`) gets the mean over the rows through it.
Besides `steps`, `rows` and `tokens`, both return the critic's targets `returns` [B, L] and
`value_mask` [B, L]. `value_loss` is the clipped value loss per token, aggregated by a loop.
"""

from __future__ import annotations

import numpy as np

from tirjax.testing.reference import stats
from tirjax.testing.reference.stats import zscore_conventions


_loss_positions = stats.generated


def _node_rows(batch: dict) -> dict[int, list[int]]:
  """Each tree node's rows, in row order (one pass over the steps)."""
  out: dict[int, list[int]] = {}
  B, T = batch["node_id"].shape
  for b in range(B):
    for t in range(T):
      if batch["step_valid"][b, t]:
        out.setdefault(int(batch["node_id"][b, t]), []).append(b)
  return out


def _sharing_rows(batch: dict, b: int, step: int) -> list[int]:
  """The rows through the node of row b's step `step` (b among them), in row order."""
  if "_node_rows" not in batch:
    batch["_node_rows"] = _node_rows(batch)
  return batch["_node_rows"][int(batch["node_id"][b, step])]


def _value(batch: dict, b: int, i: int) -> float:
  """The value of token i of row b: its node's lowest row's (one value per shared prefix)."""
  step = int(batch["token_step"][b, i])
  owner = _sharing_rows(batch, b, step)[0] if step >= 0 else b
  return float(batch["values"][owner, i])


def _gae(values: list[float], last_reward: float, gamma: float, lam: float):
  """(A, G) lists over one row's sequence: r on the last element, V past the end 0."""
  n = len(values)
  adv, ret = [0.0] * n, [0.0] * n
  running = 0.0
  for k in reversed(range(n)):
    reward = last_reward if k == n - 1 else 0.0
    next_value = values[k + 1] if k + 1 < n else 0.0
    delta = reward + gamma * next_value - values[k]
    running = delta + gamma * lam * running
    adv[k] = running
    ret[k] = running + values[k]
  return adv, ret


def _finish(batch: dict, adv: dict, ret: dict, value_keys, whiten: bool, zscore) -> dict:
  """Whitened (or raw) token advantages, steps and rows as their tokens' means, returns on the
  value positions."""
  B, L = batch["loss_mask"].shape
  positions = [(b, i) for b in range(B) for i in _loss_positions(batch, b)]
  raw = [adv[p] for p in positions]
  values = stats.zscore(raw, **zscore_conventions(zscore)) if whiten else raw
  tokens = np.zeros((B, L))
  for p, v in zip(positions, values):
    tokens[p] = v
  out = stats.token_means(batch, tokens)
  returns, value_mask = np.zeros((B, L)), np.zeros((B, L), bool)
  for p in value_keys:
    returns[p], value_mask[p] = ret[p], True
  return dict(out, returns=returns, value_mask=value_mask)


def _shared_mean(batch: dict, per_row: dict, keys) -> dict:
  """Each (b, i) key: the mean of per_row over the rows through its node at position i."""
  out = {}
  for b, i in keys:
    step = int(batch["token_step"][b, i])
    copies = [(c, i) for c in _sharing_rows(batch, b, step) if (c, i) in per_row]
    out[(b, i)] = sum(per_row[k] for k in copies) / len(copies)
  return out


def ppo(batch: dict, gamma: float = 1.0, lam: float = 1.0, whiten: bool = True, zscore=None,
        shared_prefix: str = "mean") -> dict:
  """Token-level GAE over each row's loss tokens; R_out on the last; values past the end 0."""
  batch = dict(batch)  # its node table is cached on this copy
  adv, ret = {}, {}
  for b in range(batch["row_valid"].shape[0]):
    mine = _loss_positions(batch, b)
    a, g = _gae([_value(batch, b, i) for i in mine], float(batch["outcome"][b]), gamma, lam)
    for i, x, y in zip(mine, a, g):
      adv[(b, i)], ret[(b, i)] = x, y
  if shared_prefix == "mean":
    adv, ret = _shared_mean(batch, adv, list(adv)), _shared_mean(batch, ret, list(ret))
  return _finish(batch, adv, ret, list(adv), whiten, zscore)


def ppo_turns(batch: dict, b: int) -> list[tuple[int, list[int]]]:
  """Row b's turns: (step, its loss positions) for each valid step with loss tokens."""
  mine = _loss_positions(batch, b)
  out = []
  for t in range(batch["step_valid"].shape[1]):
    at = [i for i in mine if batch["token_step"][b, i] == t]
    if batch["step_valid"][b, t] and at:
      out.append((t, at))
  return out


def turn_ppo(batch: dict, gamma: float = 0.99, lam: float = 0.9, whiten: bool = True,
             zscore=None, shared_prefix: str = "mean") -> dict:
  """Turn-level GAE: V(s_k) at turn k's first loss token, R_out on the last turn; A_k on
  every token of the turn; the critic's target G_k on the turn's first token."""
  batch = dict(batch)  # its node table is cached on this copy
  step_adv, step_ret = {}, {}
  for b in range(batch["row_valid"].shape[0]):
    turns = ppo_turns(batch, b)
    values = [_value(batch, b, at[0]) for _, at in turns]
    a, g = _gae(values, float(batch["outcome"][b]), gamma, lam)
    for (t, _), x, y in zip(turns, a, g):
      step_adv[(b, t)], step_ret[(b, t)] = x, y
  if shared_prefix == "mean":
    def mean(per):
      out = {}
      for (b, t) in per:
        copies = [(c, t) for c in _sharing_rows(batch, b, t) if (c, t) in per]
        out[(b, t)] = sum(per[k] for k in copies) / len(copies)
      return out
    step_adv, step_ret = mean(step_adv), mean(step_ret)
  adv, ret, boundary = {}, {}, []
  for b in range(batch["row_valid"].shape[0]):
    for t, at in ppo_turns(batch, b):
      for i in at:
        adv[(b, i)], ret[(b, i)] = step_adv[(b, t)], step_ret[(b, t)]
      boundary.append((b, at[0]))
  return _finish(batch, adv, ret, boundary, whiten, zscore)


def value_loss(vpreds, old_values, returns, mask, cliprange_value=None,
               aggregation: str = "token_mean", norm_constant=None) -> dict:
  """0.5 · max((v − G)², (clip(v, V_old − c, V_old + c) − G)²) per token, aggregated as the
  policy loss's (sum, den); `clipfrac` the share of masked tokens where the clipped term is
  the larger. `cliprange_value=None`: unclipped."""
  B, L = np.shape(mask)
  per, rows = {}, []
  clipped, count = 0, 0
  for b in range(B):
    row = []
    for t in range(L):
      if not mask[b][t]:
        continue
      v, g, old = float(vpreds[b][t]), float(returns[b][t]), float(old_values[b][t])
      unclipped = (v - g) ** 2
      if cliprange_value is None:
        both = unclipped
      else:
        vc = min(max(v, old - cliprange_value), old + cliprange_value)
        both = max(unclipped, (vc - g) ** 2)
        clipped += (vc - g) ** 2 > unclipped
      count += 1
      per[(b, t)] = 0.5 * both
      row.append(0.5 * both)
    rows.append(row)
  carrying = [r for r in rows if r]
  if aggregation == "token_mean":
    total, den = sum(per.values()), float(len(per))
  elif aggregation == "seq_mean_token_mean":
    total, den = sum(sum(r) / len(r) for r in carrying), float(len(carrying))
  elif aggregation == "seq_mean_token_sum":
    total, den = sum(per.values()), float(len(carrying))
  elif aggregation == "seq_mean_token_sum_norm":
    total, den = sum(per.values()) / norm_constant, float(len(carrying))
  else:
    raise ValueError(aggregation)
  return dict(sum=total, den=den, value=total / den if den else 0.0,
              clipfrac=clipped / count if count else 0.0)


