"""HGPO: step advantages averaged over nested groups of shared observation history (spec §4.4,
He et al. 2026).

    python -m experiments.train --config=configs/hgpo.py:model=tiny --workdir=runs/hgpo

Defaults (the peer code's, CazeroZ/hgpo): K = 2 history levels, weights (k + 1)^α with α = 1,
"mean_norm" (`scale="none"`) within each level, the step term alone (λ_E = 0); γ = 0.95 as
GiGPO's. A turn's observation is what the environment showed just before it (its tokens outside
the loss), read from the batch's tokens. Independent groups of n = 8, T_max = 6, no KL
(`base.portool_protocol`). Not yet run in an ablation.
"""

from configs import base


def get_config(arg=None):
  return base.make(arg, estimator="hgpo", **base.portool_protocol())
