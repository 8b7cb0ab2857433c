"""Reference unlearning diagnostic (SPEC §4.1, PORTool Theorem 3.1) with loops over nodes."""

from __future__ import annotations

import numpy as np

from tests.reference.portool import tree
from tests.reference.stats import groups, valid_steps


def necessary_nodes(batch: dict) -> set:
  """Nodes s whose parent p is a fork with a correct leaf below, all of them through s."""
  tr = tree(batch)
  correct = {b for rows in groups(batch).values() for b in rows if batch["outcome"][b] == 1}
  out = set()
  for p, kids in tr["children"].items():
    below = correct & set(tr["rows"][p])
    if len(kids) < 2 or not below:
      continue
    out |= {s for s in kids if below <= set(tr["rows"][s])}
  return out


def necessary_steps(batch: dict) -> np.ndarray:
  nodes = necessary_nodes(batch)
  out = np.zeros(batch["step_valid"].shape, bool)
  for rows in groups(batch).values():
    for b in rows:
      for t in valid_steps(batch, b):
        out[b, t] = int(batch["node_id"][b, t]) in nodes
  return out


def unlearning_rate(batch: dict, step_adv: np.ndarray) -> dict:
  """Per node: its advantage is the mean over the rows through it; per row: each (row, step)."""
  tr = tree(batch)
  nodes = necessary_nodes(batch)
  negative = 0
  for s in nodes:
    depth = tr["depth"][s]
    if np.mean([step_adv[b, depth - 1] for b in tr["rows"][s]]) < 0:
      negative += 1
  pairs = [(b, tr["depth"][s] - 1) for s in nodes for b in tr["rows"][s]]
  row_negative = sum(step_adv[b, t] < 0 for b, t in pairs)
  return dict(rate=negative / len(nodes) if nodes else 0.0, num_necessary=len(nodes),
              num_negative=negative, row_rate=row_negative / len(pairs) if pairs else 0.0)
