"""Independent reference for the policy loss (spec §5): plain Python, one token at a time.

Written from the textbook formulas, not from tirjax.loss: lists of lists in, floats out.
"""

from __future__ import annotations

import math

CLAMP = 20.0


def ratio(logp: float, old: float) -> float:
  d = max(-CLAMP, min(CLAMP, logp - old))
  return math.exp(d)


def pg(rho: float, a: float, eps_low: float, eps_high: float, c: float | None = None) -> float:
  """PPO objective min(ρA, clip(ρ)A), dual-clipped for A < 0 (Ye et al. 2020), negated."""
  clipped = min(max(rho, 1.0 - eps_low), 1.0 + eps_high)
  objective = min(rho * a, clipped * a)
  if c is not None and a < 0:
    objective = max(objective, c * a)
  return -objective


def cispo_pg(rho: float, a: float, logp: float, eps_low: float, eps_high: float) -> float:
  """CISPO (MiniMax-M1): −ŵ · A · log π with ŵ = clip(ρ, 1 − ε_low, 1 + ε_high) held fixed."""
  weight = min(max(rho, 1.0 - eps_low), 1.0 + eps_high)
  return -weight * a * logp


def cispo_grad(rho: float, a: float, eps_low: float, eps_high: float) -> float:
  """d(cispo_pg)/d log π: the weight is a constant of the gradient (stop-gradient), so
  −clip(ρ) · A, for every ρ (no token's gradient is dropped)."""
  return -min(max(rho, 1.0 - eps_low), 1.0 + eps_high) * a


def kl(logp: float, ref: float, estimator: str, clamp: float = 10.0) -> float:
  """Schulman's k1 / k2 / k3; k3 as verl's `low_var_kl`: exponent within ±20, value within
  ±clamp (0: no value clamp)."""
  log_r = ref - logp  # r = π_ref / π_θ
  if estimator == "k1":
    return -log_r
  if estimator == "k2":
    return 0.5 * log_r * log_r
  log_r = max(-CLAMP, min(CLAMP, log_r))
  value = (math.exp(log_r) - 1.0) - log_r
  return max(-clamp, min(clamp, value)) if clamp > 0 else value


def seq_ratio(logp_row, old_row, mask_row) -> float:
  """GSPO: s = (π(y)/π_old(y))^(1/|y|) = exp(mean over y of logp − old)."""
  diffs = [lp - o for lp, o, m in zip(logp_row, old_row, mask_row) if m]
  if not diffs:
    return 1.0
  return math.exp(max(-CLAMP, min(CLAMP, sum(diffs) / len(diffs))))


def aggregate(x, mask, mode: str, norm: float | None = None) -> float:
  """The full-batch value of an aggregation mode; 0 when nothing is masked in."""
  rows = [[v for v, m in zip(xr, mr) if m] for xr, mr in zip(x, mask)]
  rows = [r for r in rows if r]
  if not rows:
    return 0.0
  if mode == "token_mean":
    return sum(sum(r) for r in rows) / sum(len(r) for r in rows)
  if mode == "seq_mean_token_mean":
    return sum(sum(r) / len(r) for r in rows) / len(rows)
  if mode == "seq_mean_token_sum_norm":
    return sum(sum(r) / norm for r in rows) / len(rows)
  if mode == "seq_mean_token_sum":
    return sum(sum(r) for r in rows) / len(rows)
  raise ValueError(mode)


def policy_loss(logp, old, adv, loss_mask, row_mask, *, eps_low=0.2, eps_high=0.2, c=None,
                sequence=False, ref=None, beta=0.0, estimator="k3", entropy=None, ent_coef=0.0,
                mode="token_mean", norm=None, clamp=10.0, surrogate="clip") -> dict:
  """Per-token loss terms, then aggregated; returns {"loss", "pg", "kl", "entropy"}."""
  B, L = len(logp), len(logp[0])
  mask = [[bool(loss_mask[b][t]) and bool(row_mask[b]) for t in range(L)] for b in range(B)]
  pg_tok = [[0.0] * L for _ in range(B)]
  kl_tok = [[0.0] * L for _ in range(B)]
  ent_tok = [[0.0] * L for _ in range(B)]
  for b in range(B):
    s = seq_ratio(logp[b], old[b], mask[b])
    for t in range(L):
      if not mask[b][t]:
        continue
      rho = s if sequence else ratio(logp[b][t], old[b][t])
      if surrogate == "cispo":
        pg_tok[b][t] = cispo_pg(rho, adv[b][t], logp[b][t], eps_low, eps_high)
      else:
        pg_tok[b][t] = pg(rho, adv[b][t], eps_low, eps_high, c)
      if ref is not None:
        kl_tok[b][t] = kl(logp[b][t], ref[b][t], estimator, clamp)
      if entropy is not None:
        ent_tok[b][t] = entropy[b][t]
  total = [[pg_tok[b][t] + beta * kl_tok[b][t] - ent_coef * ent_tok[b][t] for t in range(L)]
           for b in range(B)]
  return {name: aggregate(x, mask, mode, norm) for name, x in
          (("loss", total), ("pg", pg_tok), ("kl", kl_tok), ("entropy", ent_tok))}


def diagnostics(logp, old, adv, loss_mask, row_mask, *, eps_low=0.2, eps_high=0.2, c=None,
                sequence=False) -> dict:
  """Token-level diagnostics over the loss tokens, as plain floats (0 when there are none)."""
  B, L = len(logp), len(logp[0])
  toks = []
  for b in range(B):
    mask_b = [bool(loss_mask[b][t]) and bool(row_mask[b]) for t in range(L)]
    s = seq_ratio(logp[b], old[b], mask_b)
    for t in range(L):
      if mask_b[t]:
        d = max(-CLAMP, min(CLAMP, logp[b][t] - old[b][t]))
        toks.append((s if sequence else math.exp(d), d, adv[b][t]))
  n = len(toks)
  frac = lambda pred: sum(1 for x in toks if pred(*x)) / n if n else 0.0
  mean = lambda f: sum(f(*x) for x in toks) / n if n else 0.0

  def summary(f):
    vals = [f(*x) for x in toks]
    if not vals:
      return dict(mean=0.0, std=0.0, min=0.0, max=0.0, count=0.0)
    m = sum(vals) / len(vals)
    return dict(mean=m, std=math.sqrt(sum((v - m) ** 2 for v in vals) / len(vals)),
                min=min(vals), max=max(vals), count=float(len(vals)))

  out = {
      "clip_frac_low": frac(lambda r, d, a: a < 0 and r < 1 - eps_low),
      "clip_frac_high": frac(lambda r, d, a: a > 0 and r > 1 + eps_high),
      "approx_kl_k1": mean(lambda r, d, a: -d),
      "approx_kl_k3": mean(lambda r, d, a: (math.exp(d) - 1) - d),
      "zero_adv_frac": frac(lambda r, d, a: a == 0),
  }
  if c is not None:
    out["clip_frac_dual"] = frac(lambda r, d, a: a < 0 and r > c)
  for key, f in (("ratio", lambda r, d, a: r), ("advantage", lambda r, d, a: a)):
    out.update({f"{key}/{k}": v for k, v in summary(f).items()})
  return out
