"""REINFORCE++-baseline: R_out − group mean, whitened over the batch's tokens (spec §4.4).

    python -m experiments.train --config=configs/reinforce_plus_plus_baseline.py:model=tiny \
        --workdir=runs/reinforce_plus_plus_baseline

Defaults (Hu 2025; verl's `reinforce_plus_plus_baseline`): REINFORCE++'s (configs/
reinforce_plus_plus.py: token-mean loss, independent groups of n = 8, T_max = 6, no KL), with
the group mean subtracted from R_out before the whitening. Not in the ablation snapshot
(benchmarks/results/ablation_toolworld/, older); expected, as there: within eval noise (±0.02)
of its warm start after 8 RL steps (`grid=beyond_smoke` runs it).
"""

from configs import base


def get_config(arg=None):
  return base.estimator_config(arg, "reinforce_plus_plus_baseline")
