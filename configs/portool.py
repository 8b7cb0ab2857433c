"""PORTool: rewarded rollout trees, fork-relative advantages (spec §4.1).

    python -m experiments.train --config=configs/portool.py:model=tiny --workdir=runs/portool

Paper defaults (PORTool §4): tree rollouts with n = 8 rows, branching f = 2, T_max = 6 steps;
γ = 0.95, ω1 = ω2 = 1, adaptive max/mean aggregation, κ per fork; GRPO-style clipped surrogate
(ε = 0.2) averaged per trajectory, no KL term.
Measured with `model=tiny`: benchmarks/results/ablation_toolworld/report.md (the ablation
snapshot) and benchmarks/results/ablation_default/report.md (the default's protocol).
"""

from configs import base


def get_config(arg=None):
  return base.estimator_config(arg, "portool")
