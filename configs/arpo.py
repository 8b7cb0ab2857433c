"""ARPO: entropy-adaptive branching after tool responses, GRPO advantages (spec §4.3).

    python -m experiments.train --config=configs/arpo.py:model=tiny --workdir=runs/arpo

Defaults (Dong et al. 2025; public ARPO scripts): 8 initial rollouts, 16 in total, beam 2,
branch probability 0.5, entropy weight 0.2; T_max = 6, no KL.
Measured with `model=tiny`: benchmarks/results/ablation_toolworld/report.md (the ablation
snapshot, row `arpo`).
"""

from configs import base


def get_config(arg=None):
  return base.estimator_config(arg, "arpo")
