"""The toy model of issue 51: how much per-decision signal each kind of credit carries.

A task takes K binary decisions, each right with probability p independently; it succeeds only
when all K are right. A group of G rows of one task is scored, and each row's advantage comes
from group normalisation (GRPO's, spec §4.1, with the population std and 0 for a group whose
rewards are all equal):

    A_i = (r_i − mean_G r) / std_G r

The signal on decision j is the expected policy-gradient component on its logit, per row:

    S = E[ (1/G) Σ_i A_ij · (a_ij − p) ]          (a_ij = 1 when row i got decision j right)

for three credits:
  outcome  r_i = 1[all K right], A_ij = A_i: GRPO on the outcome (the same advantage on
           every decision of the row);
  dense    r_i = (decisions right) / K, A_ij = A_i: dense partial credit on the row;
  oracle   decision j's own reward a_ij, normalised over the group per decision: a
           per-decision oracle (what perfect turn-level credit could give).

Computed exactly: the rows of a group are exchangeable, so the row-level credits sum over the
group's counts of rows with m = 0..K right decisions (a multinomial; given m, a decision is right
with probability m/K), and the oracle over the count of rows right on decision j (a binomial).
`all_fail_share` is the share of groups with no success, whose outcome advantages are all 0.
`python -m tirjax.credit.toy_signal` writes benchmarks/results/credit_toy_signal.json.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import sys
from typing import Iterator

from tirjax.reporting import benchmark

CREDITS = ("outcome", "dense", "oracle")


def _check(k: int, p: float, g: int) -> None:
  if not (isinstance(k, int) and k >= 1):
    raise ValueError(f"k: need an integer >= 1, got {k!r}")
  if not (isinstance(g, int) and g >= 2):
    raise ValueError(f"g: need an integer >= 2 (a group to normalise over), got {g!r}")
  if not 0.0 <= p <= 1.0:
    raise ValueError(f"p: need a probability in [0, 1], got {p!r}")


def group_advantages(rewards: list[float]) -> list[float]:
  """(r − mean) / std over the group (population std); all 0 when the rewards are equal."""
  mean = sum(rewards) / len(rewards)
  std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
  if std <= 1e-12 * max(1.0, abs(mean)):
    return [0.0] * len(rewards)
  return [(r - mean) / std for r in rewards]


def _compositions(total: int, parts: int) -> Iterator[tuple[int, ...]]:
  """Every tuple of `parts` non-negative ints summing to `total`."""
  for cut in itertools.combinations(range(total + parts - 1), parts - 1):
    bounds = (-1,) + cut + (total + parts - 1,)
    yield tuple(bounds[i + 1] - bounds[i] - 1 for i in range(parts))


def _multinomial(counts: tuple[int, ...]) -> float:
  out, n = 1, 0
  for c in counts:
    n += c
    out *= math.comb(n, c)
  return float(out)


def signal(credit: str, k: int, p: float, g: int) -> float:
  """S of `credit` (the module docstring) at K = `k`, p, G = `g`."""
  _check(k, p, g)
  if credit == "oracle":
    total = 0.0
    for s in range(g + 1):  # rows right on decision j
      adv = group_advantages([1.0] * s + [0.0] * (g - s))
      grad = sum(a * ((1.0 if i < s else 0.0) - p) for i, a in enumerate(adv)) / g
      total += math.comb(g, s) * p ** s * (1 - p) ** (g - s) * grad
    return total
  if credit not in CREDITS:
    raise ValueError(f"credit: must be one of {CREDITS}, got {credit!r}")
  reward = (lambda m: float(m == k)) if credit == "outcome" else (lambda m: m / k)
  q = [math.comb(k, m) * p ** m * (1 - p) ** (k - m) for m in range(k + 1)]
  total = 0.0
  for counts in _compositions(g, k + 1):  # counts[m]: rows with m decisions right
    prob = _multinomial(counts) * math.prod(q[m] ** c for m, c in enumerate(counts))
    if prob == 0.0:
      continue
    ms = [m for m, c in enumerate(counts) for _ in range(c)]
    adv = group_advantages([reward(m) for m in ms])
    total += prob * sum(a * (m / k - p) for a, m in zip(adv, ms)) / g
  return total


def all_fail_share(k: int, p: float, g: int) -> float:
  """The share of groups in which no row succeeds: (1 − p^K)^G."""
  _check(k, p, g)
  return (1.0 - p ** k) ** g


def table(ks=(2, 4), p: float = 0.5, g: int = 12) -> dict:
  """Per K: each credit's signal, its ratio to the outcome's, and GRPO's all-fail share."""
  rows = {}
  for k in ks:
    s = {c: signal(c, k, p, g) for c in CREDITS}
    rows[str(k)] = {"signal": s, "ratio_to_outcome": {c: s[c] / s["outcome"] for c in CREDITS},
                    "all_fail_share": all_fail_share(k, p, g)}
  return {"p": p, "g": g, "k": rows}


def main(argv=None) -> None:
  out = (argv or sys.argv[1:] or ["benchmarks/results/credit_toy_signal.json"])[0]
  result = {"what": "issue 51's toy model: per-decision signal of outcome (GRPO), dense "
                    "partial and per-decision oracle credit, K binary decisions, success only "
                    "when all are right, groups of G (tirjax.credit.toy_signal)",
            "computed_by": "python -m tirjax.credit.toy_signal (exact sums, no sampling)",
            # exact sums: the numbers are the same on every CPU; the machine is recorded all
            # the same, as for every result file
            "machine": benchmark.machine(jax_info=False), **table()}
  os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
  with open(out, "w") as f:
    json.dump(result, f, indent=2)
    f.write("\n")
  print(json.dumps(result["k"], indent=2))


if __name__ == "__main__":
  main()
