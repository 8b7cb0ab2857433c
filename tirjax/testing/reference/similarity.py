"""Plain-Python tool-call similarity of HiDiffTIR Appendix A.3, Eq. 22-25 (spec §4.2).

  sim(c, c*) = 1[name = name*] · (1 + J(P, P*) + Σ_{k ∈ P*} 1[c[k] = c*[k]]) / (2 + |P*|)

J is the Jaccard index of the parameter-name sets (J(∅, ∅) = 1). Values compare as decoded
JSON values: numbers by numeric value (1 = 1.0), booleans only with booleans, strings
exactly, arrays in order, objects regardless of key order.
"""

from __future__ import annotations


def json_equal(a, b) -> bool:
  if isinstance(a, bool) or isinstance(b, bool):
    return isinstance(a, bool) and isinstance(b, bool) and a == b
  if a is None or b is None:
    return a is None and b is None
  if isinstance(a, (int, float)) and isinstance(b, (int, float)):
    return a == b
  if isinstance(a, str) or isinstance(b, str):
    return isinstance(a, str) and isinstance(b, str) and a == b
  if isinstance(a, list) and isinstance(b, list):
    return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
  if isinstance(a, dict) and isinstance(b, dict):
    return set(a) == set(b) and all(json_equal(a[k], b[k]) for k in a)
  return False


def similarity(pred: dict, gt: dict) -> float:
  if pred["name"] != gt["name"]:
    return 0.0
  p, g = pred.get("arguments") or {}, gt.get("arguments") or {}
  union = set(p) | set(g)
  jaccard = len(set(p) & set(g)) / len(union) if union else 1.0
  values = sum(1 for k in g if k in p and json_equal(p[k], g[k]))
  return (1 + jaccard + values) / (2 + len(g))


def strict_similarity(pred: dict, gt: dict, directions: dict) -> float:
  """`similarity`, or 0 when a parameter that `directions[gt's tool]` names as a direction
  is missing from `pred` or differs from `gt`'s (issue 51's strict option)."""
  p, g = pred.get("arguments") or {}, gt.get("arguments") or {}
  for k in directions.get(gt["name"], ()):
    if k in g and not (k in p and json_equal(p[k], g[k])):
      return 0.0
  return similarity(pred, gt)
