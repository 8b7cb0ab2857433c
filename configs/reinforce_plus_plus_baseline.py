"""REINFORCE++-baseline: R_out − group mean, whitened over the batch's tokens (spec §4.4).

    python -m experiments.train --config=configs/reinforce_plus_plus_baseline.py:model=tiny \
        --workdir=runs/reinforce_plus_plus_baseline

Defaults (Hu 2025; verl's `reinforce_plus_plus_baseline`): REINFORCE++'s (configs/
reinforce_plus_plus.py: token-mean loss, independent groups of n = 8, T_max = 6, no KL), with
the group mean subtracted from R_out before the whitening.
Trained in the credit testbed's grid (`grid=credit`): benchmarks/results/ablation_credit/verdict.md;
its credit on labelled turns: benchmarks/results/credit_fidelity.md and
benchmarks/results/credit_bench_beyond.md.
"""

from configs import base


def get_config(arg=None):
  return base.estimator_config(arg, "reinforce_plus_plus_baseline")
