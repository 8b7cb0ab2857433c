"""Independent reference for the decoupled PPO objective of k-step off-policy rollouts
(`tirjax.trainer.staleness`; AReaL, arXiv 2505.24298): plain Python, one token at a time.

Each row b was sampled by the policy of version v_b; `behaviour[v]` holds version v's
log-probs of every row's tokens, and the row's behaviour log-probs are those of its own
version. Per loss token: u = π_θ / π_prox, w = min(π_prox / π_behav, C), the term
−w · min(u A, clip(u, 1 − ε_low, 1 + ε_high) A), aggregated over the loss tokens.
"""

from __future__ import annotations

import math

from tirjax.testing.reference import loss as loss_ref

CLAMP = 20.0


def behaviour_weight(prox: float, behav: float, cap: float) -> float:
  """min(π_prox / π_behav, C), the log-ratio clamped to ±20 first (as the trainer's is)."""
  x = max(-CLAMP, min(CLAMP, prox - behav))
  return cap if x > math.log(cap) else math.exp(x)


def decoupled_pg_loss(logp, prox, behaviour: dict, row_version, adv, loss_mask, row_mask, *,
                      cap=2.0, mode="token_mean", eps_low=0.2, eps_high=0.2, norm=None) -> float:
  """The decoupled objective's policy term (negated) of a batch whose row b was sampled by
  version `row_version[b]`: `behaviour[row_version[b]][b]` are its behaviour log-probs."""
  B, L = len(logp), len(logp[0])
  mask = [[bool(loss_mask[b][t]) and bool(row_mask[b]) for t in range(L)] for b in range(B)]
  x = []
  for b in range(B):
    behav = behaviour[row_version[b]][b]
    row = []
    for t in range(L):
      if not mask[b][t]:
        row.append(0.0)
        continue
      w = behaviour_weight(prox[b][t], behav[t], cap)
      row.append(w * loss_ref.pg(loss_ref.ratio(logp[b][t], prox[b][t]), adv[b][t], eps_low,
                                 eps_high))
    x.append(row)
  return loss_ref.aggregate(x, mask, mode, norm)
