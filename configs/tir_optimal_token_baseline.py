"""TIR-OTB: OTB's per-token baselines with positions counted over generated tokens (spec §4.4).

    python -m experiments.train --config=configs/tir_optimal_token_baseline.py:model=tiny \
        --workdir=runs/tir_optimal_token_baseline

Defaults: OTB's (configs/optimal_token_baseline.py: groups of n = 8, token-mean loss, no KL,
the sampled energy 1 − π(a)); the k-th generated token of every row shares a baseline,
whatever the tool responses between turns (verl's `tir_optimal_token_baseline`). Not measured
in training yet; `grid=beyond_smoke` runs it.
"""

from configs import base


def get_config(arg=None):
  return base.estimator_config(arg, "tir_optimal_token_baseline")
