"""Dr. GRPO: outcome minus the group mean, no std; token sums over a fixed constant (SPEC §4.3).

    python -m experiments.train --config=configs/dr_grpo.py:model=tiny --workdir=runs/dr_grpo

Defaults (Liu et al. 2025): independent groups of n = 8 rollouts, T_max = 6; the loss sums each
row's token terms and divides by a constant (the step limit times the per-step generation
budget), no KL.
Measured with `model=tiny` (hidifftir, seeds 0-2; benchmarks/results/default_run.json): the SFT
warm start reaches 0.27-0.42 greedy eval accuracy and 40 RL steps add +0.008 to +0.023, within
eval noise; the papers report their gains on 1.7B-7B models.
"""

from configs import base


def get_config(arg=None):
  c = base.make(arg, estimator="dr_grpo", rollout=dict(mode="independent", n=8, max_steps=6),
                loss=dict(kl_coef=0.0, aggregation="seq_mean_token_sum_norm", norm_constant=1.0))
  # A live reference: an override of rollout.max_steps or max_new_tokens moves the constant.
  c.loss.norm_constant = (c.rollout.get_ref("max_steps") *
                          c.rollout.get_ref("max_new_tokens")).to_float()
  return c
