"""Reference metrics written from the papers: PORTool §4 (four axes), HiDiffTIR Eq. 18-20."""


def solve(n_match, n_gen, n_gt):
  p = 1.0 if n_gen == 0 else n_match / n_gen
  r = n_match / n_gt
  f1 = 0.0 if p + r == 0 else 2 * p * r / (p + r)  # the harmonic mean of P and R
  return p, r, f1


def per_query_mean(pairs):
  queries = {}
  for q, v in pairs:
    queries.setdefault(q, []).append(v)
  means = [sum(v) / len(v) for v in queries.values()]
  return sum(means) / len(means)
