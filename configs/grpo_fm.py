"""grpo_fm: the outcome-level group baseline `grpo_fm` (SPEC §4.3).

    python -m experiments.train --config=configs/grpo_fm.py:model=tiny --workdir=runs/grpo_fm

Defaults as PORTool compares it: independent groups of n = 8 rollouts, T_max = 6, clipped
surrogate (ε = 0.2) averaged per trajectory, no KL term.
Measured with `model=tiny` (hidifftir, seeds 0-2; benchmarks/results/default_run.json): the SFT
warm start reaches 0.27-0.42 greedy eval accuracy and 40 RL steps add +0.008 to +0.023, within
eval noise; the papers report their gains on 1.7B-7B models.
"""

from configs import base


def get_config(arg=None):
  return base.make(arg, estimator="grpo_fm", rollout=dict(mode="independent", n=8, max_steps=6),
                   loss=dict(kl_coef=0.0, aggregation="seq_mean_token_mean"))
