"""Reference similarity of a predicted call to a ground-truth call (HiDiffTIR Eq. 22-25)."""


def _same(a, b):
  if isinstance(a, bool) or isinstance(b, bool):
    return type(a) is type(b) and a == b
  if isinstance(a, (int, float)) and isinstance(b, (int, float)):
    return float(a) == float(b)
  if isinstance(a, list) and isinstance(b, list):
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
  if isinstance(a, dict) and isinstance(b, dict):
    return set(a) == set(b) and all(_same(a[k], b[k]) for k in a)
  return type(a) is type(b) and a == b


def similarity(pred, gt):
  if pred["name"] != gt["name"]:
    return 0.0
  p, g = set(pred["arguments"]), set(gt["arguments"])
  jaccard = 1.0 if not (p | g) else len(p & g) / len(p | g)
  values = sum(1 for k in g if k in p and _same(pred["arguments"][k], gt["arguments"][k]))
  return (1 + jaccard + values) / (2 + len(g))
