"""Dr. GRPO: outcome minus the group mean, no std; token sums over a fixed constant (spec §4.3).

    python -m experiments.train --config=configs/dr_grpo.py:model=tiny --workdir=runs/dr_grpo

Defaults (Liu et al. 2025): independent groups of n = 8 rollouts, T_max = 6; the loss sums each
row's token terms and divides by a constant (the step limit times the per-step generation
budget), no KL.
Measured with `model=tiny`: benchmarks/results/ablation_toolworld/report.md (the ablation
snapshot, row `dr_grpo`).
"""

from configs import base


def get_config(arg=None):
  return base.estimator_config(arg, "dr_grpo")
