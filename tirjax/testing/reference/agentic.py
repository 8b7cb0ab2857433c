"""References of the agentic step- and tree-level estimators gigpo and tree_grpo (spec §4.4),
written from their papers with dicts over groups, anchor states, trees and rows."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from tirjax.testing.reference import stats
from tirjax.testing.reference.group import _result
from tirjax.testing.reference.stats import groups, valid_steps, zscore_conventions


def _group_zscores(batch: dict, conv: dict, per_step: bool = False) -> dict[int, float]:
  """Each row's z-score of R_out in its group; `per_step`: every row's R_out counted once per
  valid step it has (verl-agent's statistics across step rows)."""
  out = {}
  for rows in groups(batch).values():
    if not per_step:
      out.update(zip(rows, stats.zscore([float(batch["outcome"][b]) for b in rows], **conv)))
      continue
    members = [b for b in rows for _ in valid_steps(batch, b)]
    z = stats.zscore([float(batch["outcome"][b]) for b in members], **conv)
    out.update({b: 0.0 for b in rows})
    out.update(dict(zip(members, z)))
  return out


def gigpo(batch: dict, gamma: float = 0.95, omega: float = 1.0, anchor: str = "state",
          zscore=None, episode_stats: str = "trajectory") -> dict:
  """GiGPO (Feng et al. 2025, Eq. 3-8): A^E(τ_j) + ω · A^S(s_{j,t}).

  A^E: z-score of R_out in the query's group. Step groups: the (row, step) pairs of a query
  with the same anchor, the recorded state id ("state") or the same parent node, the query's
  root for a first step ("prefix"). A^S: z-score of the step's discounted return
  γ^(T_j − t) · R_out (t 1-based) within its step group. `episode_stats="step"`: A^E's
  statistics over the group's (row, step) pairs instead of its rows (verl-agent's).
  """
  conv = zscore_conventions(zscore)
  episode = _group_zscores(batch, conv, per_step=episode_stats == "step")
  members = defaultdict(list)  # anchor -> [(row, step, return)]
  for g, rows in groups(batch).items():
    for b in rows:
      num_steps, outcome = int(batch["num_steps"][b]), float(batch["outcome"][b])
      for t in valid_steps(batch, b):
        if anchor == "state":
          key = ("state", int(batch["state_id"][b, t]))
        else:
          key = ("parent", g, int(batch["node_id"][b, t - 1]) if t > 0 else "root")
        members[key].append((b, t, gamma ** (num_steps - (t + 1)) * outcome))
  B, T = batch["step_valid"].shape
  steps, rows_out = np.zeros((B, T)), np.zeros(B)
  for b, a in episode.items():
    rows_out[b] = a
  for group in members.values():
    for (b, t, _), a_step in zip(group, stats.zscore([ret for _, _, ret in group], **conv)):
      steps[b, t] = episode[b] + omega * a_step
  return dict(steps=steps, rows=rows_out)


def tree_grpo(batch: dict, zscore=None) -> dict:
  """Tree-GRPO (Ji et al. 2025): z-score of R_out among the rows of the row's tree (the rows
  through its first node; none for a row without steps) + among the query's rows."""
  conv = zscore_conventions(zscore)
  inter = _group_zscores(batch, conv)
  trees = defaultdict(list)
  for rows in groups(batch).values():
    for b in rows:
      if batch["num_steps"][b] > 0:
        trees[int(batch["node_id"][b, 0])].append(b)
  intra = defaultdict(float)
  for rows in trees.values():
    intra.update(zip(rows, stats.zscore([float(batch["outcome"][b]) for b in rows], **conv)))
  return _result(batch, {b: intra[b] + a for b, a in inter.items()})
