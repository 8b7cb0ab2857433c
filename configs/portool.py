"""PORTool: rewarded rollout trees, fork-relative advantages (SPEC §4.1).

    python -m experiments.train --config=configs/portool.py:model=tiny --workdir=runs/portool

Paper defaults (PORTool §4): tree rollouts with n = 8 rows, branching f = 2, T_max = 6 steps;
γ = 0.95, ω1 = ω2 = 1, adaptive max/mean aggregation, κ per fork; GRPO-style clipped surrogate
(ε = 0.2) averaged per trajectory, no KL term.
Measured with `model=tiny` (hidifftir, seeds 0-2; benchmarks/results/default_run.json): the SFT
warm start reaches 0.27-0.42 greedy eval accuracy and 40 RL steps add +0.008 to +0.023, within
eval noise; the papers report their gains on 1.7B-7B models.
"""

from configs import base


def get_config(arg=None):
  return base.make(arg, estimator="portool",
                   rollout=dict(mode="tree", n=8, max_steps=6, tree=dict(branch_factor=2)),
                   loss=dict(kl_coef=0.0, aggregation="seq_mean_token_mean"))
