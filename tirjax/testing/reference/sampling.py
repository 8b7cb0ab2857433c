"""Reference next-token distribution of a sampler: temperature, then top-p (nucleus), in plain
Python floats (Holtzman et al. 2020).

  q_v ∝ exp(z_v / τ);  sort q descending;  keep token (i) iff Σ_{j<i} q_(j) < top_p;
  the result is q restricted to the kept tokens, renormalised.
"""

import math


def nucleus_distribution(logits, top_p, temperature=1.0):
  """{token id: probability} of the tokens a sampler may draw (τ > 0)."""
  z = [float(x) / temperature for x in logits]
  m = max(z)
  e = [math.exp(x - m) for x in z]
  total = sum(e)
  q = [x / total for x in e]
  order = sorted(range(len(q)), key=lambda v: -q[v])
  kept, before = [], 0.0
  for v in order:
    if before >= top_p:
      break
    kept.append(v)
    before += q[v]
  mass = sum(q[v] for v in kept)
  return {v: q[v] / mass for v in kept}


def kept_margin(logits, top_p, temperature=1.0):
  """Distance of top_p from the nearest cumulative mass Σ_{j<i} q_(j): how close a kept set
  is to changing under rounding."""
  z = [float(x) / temperature for x in logits]
  m = max(z)
  e = [math.exp(x - m) for x in z]
  total = sum(e)
  q = sorted((x / total for x in e), reverse=True)
  before, margin = 0.0, math.inf
  for p in q:
    margin = min(margin, abs(before - top_p))
    before += p
  return margin
