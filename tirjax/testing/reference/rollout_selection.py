"""Reference formulas of the rollout selection rules, written from spec §4.1 and the ARPO paper
and code, sharing no code with `tirjax.episodes`.

* PORTool Algorithm 1 chooses `keep` of `N` candidates uniformly without replacement: each
  candidate is kept with probability keep/N, each pair with keep(keep−1)/(N(N−1)).
* ARPO (Dong et al. 2025, Eq. 2-3; dongguanting/ARPO): the entropy of a step is the sum over
  its first k positions of the position entropy (full vocabulary, or −Σ p log p over the
  top-k log-probs), divided by log|V|; a try branches iff clip(u − w·ΔH, 0, 1) ≤ τ, u uniform,
  so with probability clip(τ + w·ΔH, 0, 1) for τ < 1, and always for τ = 1.
"""

import math


def inclusion_probability(num_candidates: int, keep: int) -> float:
  return keep / num_candidates


def pair_inclusion_probability(num_candidates: int, keep: int) -> float:
  if num_candidates < 2:
    return 0.0
  return keep * (keep - 1) / (num_candidates * (num_candidates - 1))


def entropy_of_logits(logits) -> float:
  """Full-vocabulary entropy of one position, by loops."""
  top = max(logits)
  z = sum(math.exp(x - top) for x in logits)
  h = 0.0
  for x in logits:
    p = math.exp(x - top) / z
    if p > 0:
      h -= p * math.log(p)
  return h


def step_entropy_from_logits(logits_per_position, k: int, vocab: int) -> float:
  total = 0.0
  for j, logits in enumerate(logits_per_position):
    if j >= k:
      break
    total += entropy_of_logits(logits)
  return total / math.log(vocab)


def step_entropy_from_top(top_per_position, k: int, vocab: int) -> float:
  """The public ARPO code: all top-k log-probs of the first k positions in one list."""
  bag = []
  for j, top in enumerate(top_per_position):
    if j >= k:
      break
    bag.extend(top.values())
  return -sum(math.exp(lp) * lp for lp in bag) / math.log(vocab)


def branch_probability(delta: float, tau: float, weight: float) -> float:
  if tau >= 1:
    return 1.0
  return min(max(tau + weight * delta, 0.0), 1.0)
