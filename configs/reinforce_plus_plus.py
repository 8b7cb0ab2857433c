"""REINFORCE++: token-level discounted returns of R_out, whitened over the batch (SPEC §4.4).

    python -m experiments.train --config=configs/reinforce_plus_plus.py:model=tiny \
        --workdir=runs/reinforce_plus_plus

Defaults (Hu 2025; verl's `reinforce_plus_plus`): γ = 1, whitening over every generated token
of the batch, the token-mean loss (the paper's token-level objective); PORTool's protocol
otherwise (`base.portool_protocol`: independent groups of n = 8, T_max = 6, no KL).
Not in the ablation snapshot (benchmarks/results/ablation_toolworld/, which predates it); every
estimator there ended within eval noise (±0.02) of its warm start after 8 RL steps, and so is
this one expected to. Its smoke run (`configs/ablate.py:grid=beyond_smoke`) trains end to end.
"""

from configs import base


def get_config(arg=None):
  return base.make(arg, estimator="reinforce_plus_plus", **base.portool_protocol(
      loss=dict(aggregation="token_mean")))
