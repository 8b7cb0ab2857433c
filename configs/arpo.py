"""ARPO: entropy-adaptive branching after tool responses, GRPO advantages (SPEC §4.3).

    python -m experiments.train --config=configs/arpo.py:model=tiny --workdir=runs/arpo

Defaults (Dong et al. 2025; public ARPO scripts): 8 initial rollouts, 16 in total, beam 2,
branch probability 0.5, entropy weight 0.2; T_max = 6, no KL. Expected result with `model=tiny` (about 14 min on 2 CPU cores): the tiny SFT
warm-start reaches about 0.1 greedy eval accuracy on toolworld and 40 RL steps stay within
eval noise (measured for hidifftir: README, `make run`); the tiny scale checks the pipeline,
not the method, whose gains the papers report on 1.7B-7B models.
"""

from configs import base


def get_config(arg=None):
  return base.make(arg, estimator="arpo", rollout=dict(mode="arpo", max_steps=6),
                   loss=dict(kl_coef=0.0, aggregation="seq_mean_token_mean"))
