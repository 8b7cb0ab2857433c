"""Reference unlearning diagnostic (spec §4.1, PORTool Theorem 3.1) with loops over nodes."""

from __future__ import annotations

import numpy as np

from tirjax.testing.reference.portool import tree
from tirjax.testing.reference.stats import groups, valid_steps


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


def step_weights(batch: dict, aggregation: str, row_mask=None) -> np.ndarray:
  """w[k, t]: tokens of step t of row k in the loss, × 1/|τ_k| for seq_mean_token_mean."""
  B, T = batch["step_valid"].shape
  w = np.zeros((B, T))
  for rows in groups(batch).values():
    for k in rows:
      if row_mask is not None and not row_mask[k]:
        continue
      length = int(np.sum(batch["loss_mask"][k]))
      for t in valid_steps(batch, k):
        n = sum(1 for l in range(batch["loss_mask"].shape[1])
                if batch["loss_mask"][k, l] and batch["token_step"][k, l] == t)
        w[k, t] = n / max(length, 1) if aggregation == "seq_mean_token_mean" else n
  return w


def unlearning_rate(batch: dict, step_adv: np.ndarray, aggregation: str = "seq_mean_token_mean",
                    row_mask=None) -> dict:
  """Per node: the net push Σ_k w_k A(s, k) over the rows through it; per row: each (row, step)."""
  tr = tree(batch)
  nodes = necessary_nodes(batch)
  w = step_weights(batch, aggregation, row_mask)
  negative = 0
  pushes = {}
  for s in nodes:
    t = tr["depth"][s] - 1
    pushes[s] = sum(w[b, t] * step_adv[b, t] for b in tr["rows"][s])
    negative += pushes[s] < 0
  pairs = [(b, tr["depth"][s] - 1) for s in nodes for b in tr["rows"][s]]
  row_negative = sum(step_adv[b, t] < 0 for b, t in pairs)
  return dict(rate=negative / len(nodes) if nodes else 0.0, num_necessary=len(nodes),
              num_negative=negative, row_rate=row_negative / len(pairs) if pairs else 0.0,
              pushes=pushes)
