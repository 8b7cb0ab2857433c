"""rloo: the outcome-level group baseline `rloo` (SPEC §4.3).

    python -m experiments.train --config=configs/rloo.py:model=tiny --workdir=runs/rloo

Defaults as PORTool compares it: independent groups of n = 8 rollouts, T_max = 6, clipped
surrogate (ε = 0.2) averaged per trajectory, no KL term. Expected result with `model=tiny` (about 14 min on 2 CPU cores): the tiny SFT
warm-start reaches about 0.1 greedy eval accuracy on toolworld and 40 RL steps stay within
eval noise (measured for hidifftir: README, `make run`); the tiny scale checks the pipeline,
not the method, whose gains the papers report on 1.7B-7B models.
"""

from configs import base


def get_config(arg=None):
  return base.make(arg, estimator="rloo", rollout=dict(mode="independent", n=8, max_steps=6),
                   loss=dict(kl_coef=0.0, aggregation="seq_mean_token_mean"))
