"""DAPO's dynamic sampling: keep the groups with reward variance, refill from more rollouts.

DAPO (Yu et al. 2025, §3.2) over-samples and drops groups whose rewards are all equal, so
that every group in a batch carries a gradient. `take_groups` assembles a batch of fixed
shape from groups of several rollout batches: rows are copied, group ids renumbered in order,
tree node ids and anchor-state ids renumbered densely (they stay batch-global and in range),
and the remaining rows are padding.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import numpy as np

from tirjax.rollouts import Rollouts, from_numpy, take_rows, to_numpy

def take_groups(parts: Sequence[tuple[Rollouts, list]], keep: Sequence[tuple[int, int]],
                num_rows: int) -> tuple[Rollouts, list]:
  """The rows of groups `keep` = [(part index, group id), ...] as one batch of `num_rows`.

  `parts` are (rollouts, episode records) pairs of one shape; records (with `.row` and
  `.group`) follow their rows. Returns (rollouts, records).
  """
  leaves = [to_numpy(r) for r, _ in parts]
  sources = []  # (part, row)
  for new_group, (p, g) in enumerate(keep):
    rows = np.flatnonzero(leaves[p]["row_valid"] & (leaves[p]["group_id"] == g))
    sources += [(p, b, new_group) for b in rows]
  if len(sources) > num_rows:
    raise ValueError(f"take_groups: the kept groups have {len(sources)} rows; num_rows is "
                     f"{num_rows}")
  offsets = np.cumsum([0] + [len(leaf["group_id"]) for leaf in leaves])
  stacked = {name: np.concatenate([leaf[name] for leaf in leaves]) for name in leaves[0]}
  out = take_rows(stacked, [offsets[p] + b for p, b, _ in sources], num_rows)
  out["group_id"][:len(sources)] = [g for _, _, g in sources]
  part_of = np.zeros(num_rows, np.int64)
  part_of[:len(sources)] = [p for p, _, _ in sources]
  for name in ("node_id", "state_id"):  # batch-global ids: one numbering across the parts
    if name in out:
      ids = out[name]
      keys = np.where(ids >= 0, part_of[:, None] * (ids.max() + 2) + ids, -1)
      ids[ids >= 0] = np.unique(keys[ids >= 0], return_inverse=True)[1].reshape(-1)
  rollouts = from_numpy(out)
  records = []
  by_source = {(p, rec.row): rec for p, (_, recs) in enumerate(parts) for rec in recs}
  for i, (p, b, g) in enumerate(sources):
    rec = by_source.get((p, b))
    if rec is not None:
      records.append(dataclasses.replace(rec, row=i, group=g))
  return rollouts, records


def kept_groups(r: Rollouts, row_mask: jax.Array) -> list[int]:
  """Group ids with at least one row in the loss (DAPO masks whole groups)."""
  gid, keep = np.asarray(r.group_id), np.asarray(row_mask) & np.asarray(r.row_valid)
  return sorted({int(g) for g in gid[keep]})


def dapo_refill(first, estimator, options, resample: Callable[[int], object], num_queries: int,
                tries: int) -> tuple[Rollouts, list, int]:
  """Keeps `first`'s groups with reward variance and adds groups of `resample(k)` (rollout
  batches of fresh queries, k = 1, 2, ...) until `num_queries` groups or `tries` rounds.

  Returns (rollouts, episode records, rounds of resampling). Without a refill the batch is
  returned as it is (filtered groups stay masked by the estimator).
  """
  parts = [(first.rollouts, first.episodes)]
  kept = [(0, g) for g in kept_groups(first.rollouts, estimator(first.rollouts, options).row_mask)]
  rounds = 0
  while len(kept) < num_queries and rounds < tries:
    rounds += 1
    more = resample(rounds)
    parts.append((more.rollouts, more.episodes))
    kept += [(len(parts) - 1, g)
             for g in kept_groups(more.rollouts, estimator(more.rollouts, options).row_mask)]
  if rounds == 0 or not kept:
    return first.rollouts, first.episodes, rounds
  rollouts, records = take_groups(parts, kept[:num_queries], first.rollouts.num_rows)
  return rollouts, records, rounds
