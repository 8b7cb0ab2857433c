"""PORTool: rewarded rollout trees, fork-relative advantages (SPEC §4.1).

    python -m experiments.train --config=configs/portool.py:model=tiny --workdir=runs/portool

Paper defaults (PORTool §4): tree rollouts with n = 8 rows, branching f = 2, T_max = 6 steps;
γ = 0.95, ω1 = ω2 = 1, adaptive max/mean aggregation, κ per fork; GRPO-style clipped surrogate
(ε = 0.2) averaged per trajectory, no KL term.
Measured with `model=tiny` (ablation snapshot, benchmarks/results/ablation_toolworld/, 128 tasks):
eval accuracy 0.135 ± 0.030 (3 seeds, 8 RL steps) from its warm start's 0.125.
On the default's protocol (`configs/ablate.py:grid=default`, benchmarks/results/ablation_default/,
256 tasks): greedy accuracy gains +0.070/+0.160/+0.047 over 40 RL steps (seeds 0-2) from warm starts
0.344/0.301/0.289 (1200 SFT steps, a Zen 5 EPYC).
"""

from configs import base


def get_config(arg=None):
  return base.make(arg, estimator="portool", **base.portool_protocol(
      "tree", rollout=dict(tree=dict(branch_factor=2))))
