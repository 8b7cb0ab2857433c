"""Reference group statistics (spec §3) and token-to-step means: plain loops, apart from tirjax."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Optional, Sequence

import numpy as np

# spec §3 defaults: ddof 1, scale "std", singleton "zero", eps 1e-6.
DEFAULTS = dict(ddof=1, scale="std", singleton="zero", eps=1e-6)


def zscore_conventions(zscore: Optional[Any], **defaults) -> dict:
  """The conventions of a `segments.ZScore`-like object (None: spec defaults, or `defaults`)."""
  out = {**DEFAULTS, **defaults}
  if zscore is not None:
    out = {k: getattr(zscore, k) for k in DEFAULTS}
  return out


def zscore(values: Sequence[float], ddof: int = 1, scale: str = "std", singleton: str = "zero",
           eps: float = 1e-6) -> list[float]:
  """z-scores of one group: (x − mean) / (std + eps); singletons 0 (or raw); all-equal → 0."""
  n = len(values)
  if n == 0:
    return []
  if n == 1:
    return [float(values[0]) if singleton == "raw" else 0.0]
  if max(values) == min(values):
    return [0.0] * n
  mean = sum(values) / n
  if scale == "none":
    return [v - mean for v in values]
  std = math.sqrt(sum((v - mean) ** 2 for v in values) / max(n - ddof, 1))
  return [(v - mean) / (std + eps) for v in values]


def groups(batch: dict) -> dict[int, list[int]]:
  """Valid rows of each query, in row order."""
  out: dict[int, list[int]] = defaultdict(list)
  for b, (g, valid) in enumerate(zip(batch["group_id"], batch["row_valid"])):
    if valid:
      out[int(g)].append(b)
  return dict(out)


def valid_steps(batch: dict, b: int) -> list[int]:
  return [t for t in range(batch["step_valid"].shape[1]) if batch["step_valid"][b, t]]


def generated(batch: dict, b: int) -> list[int]:
  """Positions of row b's own (loss) tokens; a padding row has none."""
  if not batch["row_valid"][b]:
    return []
  return [i for i in range(batch["loss_mask"].shape[1]) if batch["loss_mask"][b, i]]


def token_means(batch: dict, tokens) -> dict:
  """Token advantages [B, L] with each step's and each row's as the mean of its own tokens'."""
  B, T = batch["step_valid"].shape
  steps, rows = np.zeros((B, T)), np.zeros(B)
  for b in range(B):
    mine = generated(batch, b)
    if mine:
      rows[b] = sum(tokens[b, i] for i in mine) / len(mine)
    for t in range(T):
      at = [i for i in mine if batch["token_step"][b, i] == t]
      if at:
        steps[b, t] = sum(tokens[b, i] for i in at) / len(at)
  return dict(steps=steps, rows=rows, tokens=tokens)
