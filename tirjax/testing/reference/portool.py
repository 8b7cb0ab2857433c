"""Reference PORTool (spec §4.1), written from the spec with dicts over trees and rows.

Nodes are keyed by their `node_id`; the root of query g is the key ("root", g).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from tirjax.testing.reference import stats
from tirjax.testing.reference.stats import groups, valid_steps, zscore_conventions


def tree(batch: dict) -> dict:
  """rows through each node, children of each parent, parent and depth of each node."""
  rows_through = defaultdict(list)
  children = defaultdict(list)
  parent, depth = {}, {}
  for g, rows in groups(batch).items():
    rows_through[("root", g)] = list(rows)
    for b in rows:
      prev = ("root", g)
      for t in valid_steps(batch, b):
        node = int(batch["node_id"][b, t])
        rows_through[node].append(b)
        if node not in parent:
          parent[node], depth[node] = prev, t + 1
          children[prev].append(node)
        prev = node
  group_of = {node: g for g, rows in groups(batch).items() for b in rows
              for node in (int(batch["node_id"][b, t]) for t in valid_steps(batch, b))}
  return dict(rows=dict(rows_through), children=dict(children), parent=parent, depth=depth,
              group=group_of)


def num_forks(tr: dict) -> dict[int, int]:
  out = defaultdict(int)
  for p, kids in tr["children"].items():
    if len(kids) >= 2:
      out[p[1] if isinstance(p, tuple) else tr["group"][p]] += 1
  return out


def portool(batch: dict, gamma: float = 0.95, omega1: float = 1.0, omega2: float = 1.0,
            tree_aggregation: str = "adaptive", shared_step_trj: str = "mean",
            fork_scale: str = "per_fork", tie_tol: float = 1e-6, zscore=None) -> dict:
  conv = zscore_conventions(zscore)
  tr = tree(batch)
  outcome, num_steps = batch["outcome"], batch["num_steps"]

  def terms(node):
    t = tr["depth"][node]
    return [gamma ** (int(num_steps[k]) - t) * float(outcome[k]) for k in tr["rows"][node]]

  def format_reward(node):  # every row through the node carries the same step
    b = tr["rows"][node][0]
    return float(batch["format_reward"][b, tr["depth"][node] - 1])

  # Eq. 2 with G chosen per parent: max unless the children's max terms all tie, then mean.
  reward = {}
  for p, kids in tr["children"].items():
    best = [max(terms(s)) for s in kids]
    if tree_aggregation == "adaptive":
      use_max = max(best) - min(best) > tie_tol
    else:
      use_max = tree_aggregation == "max"
    for s in kids:
      ts = terms(s)
      reward[s] = (max(ts) if use_max else sum(ts) / len(ts)) + format_reward(s)

  a_fork = defaultdict(float)
  for p, kids in tr["children"].items():
    if len(kids) >= 2:
      for s, z in zip(kids, stats.zscore([reward[s] for s in kids], **conv)):
        a_fork[s] = z

  a_trj = {}
  for rows in groups(batch).values():
    for b, z in zip(rows, stats.zscore([float(outcome[b]) for b in rows], **conv)):
      a_trj[b] = z

  forks = num_forks(tr)
  B, T = batch["step_valid"].shape
  steps, rows_out = np.zeros((B, T)), np.zeros(B)
  for g, rows in groups(batch).items():
    for b in rows:
      rows_out[b] = a_trj[b]
      for t in valid_steps(batch, b):
        s = int(batch["node_id"][b, t])
        p = tr["parent"][s]
        through = tr["rows"][s]
        trj = (sum(a_trj[k] for k in through) / len(through) if shared_step_trj == "mean"
               else a_trj[b])
        kappa = 1.0
        if fork_scale == "per_fork" and len(tr["children"][p]) >= 2:
          kappa = len(rows) / (len(tr["rows"][p]) * forks[g])
        steps[b, t] = omega1 * trj + omega2 * kappa * a_fork[s]
  return dict(steps=steps, rows=rows_out)
