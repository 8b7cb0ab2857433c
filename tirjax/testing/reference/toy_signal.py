"""Brute-force reference of `tirjax.credit.toy_signal`: every joint outcome of a group.

Enumerates all 2^(K·G) right/wrong patterns of a group of G rows with K decisions each, with
their probabilities, and averages the per-decision gradient of each credit directly (decision
0's: the decisions are exchangeable). Only for small K·G.
"""

from __future__ import annotations

import itertools
import math


def _normalised(rewards):
  mean = sum(rewards) / len(rewards)
  std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
  if std <= 1e-12 * max(1.0, abs(mean)):
    return [0.0] * len(rewards)
  return [(r - mean) / std for r in rewards]


def signal(credit: str, k: int, p: float, g: int) -> float:
  total = 0.0
  for bits in itertools.product((0, 1), repeat=k * g):
    rows = [bits[i * k:(i + 1) * k] for i in range(g)]
    prob = 1.0
    for b in bits:
      prob *= p if b else 1 - p
    if credit == "outcome":
      adv = _normalised([float(all(r)) for r in rows])
    elif credit == "dense":
      adv = _normalised([sum(r) / k for r in rows])
    else:  # oracle: decision 0's own reward, normalised over the group
      adv = _normalised([float(r[0]) for r in rows])
    total += prob * sum(a * (r[0] - p) for a, r in zip(adv, rows)) / g
  return total


def all_fail_share(k: int, p: float, g: int) -> float:
  share = 0.0
  for bits in itertools.product((0, 1), repeat=k * g):
    rows = [bits[i * k:(i + 1) * k] for i in range(g)]
    if not any(all(r) for r in rows):
      prob = 1.0
      for b in bits:
        prob *= p if b else 1 - p
      share += prob
  return share
