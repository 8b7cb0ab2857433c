"""ARPO: entropy-adaptive branching after tool responses, GRPO advantages (SPEC §4.3).

    python -m experiments.train --config=configs/arpo.py:model=tiny --workdir=runs/arpo

Defaults (Dong et al. 2025; public ARPO scripts): 8 initial rollouts, 16 in total, beam 2,
branch probability 0.5, entropy weight 0.2; T_max = 6, no KL.
Measured with `model=tiny` (hidifftir, seeds 0-2; benchmarks/results/default_run.json): the SFT
warm start reaches 0.27-0.42 greedy eval accuracy and 40 RL steps add +0.008 to +0.023, within
eval noise; the papers report their gains on 1.7B-7B models.
"""

from configs import base


def get_config(arg=None):
  return base.make(arg, estimator="arpo", rollout=dict(mode="arpo", max_steps=6),
                   loss=dict(kl_coef=0.0, aggregation="seq_mean_token_mean"))
