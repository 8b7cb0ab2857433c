"""MT-GRPO: the outcome advantage plus λ times a turn-reward advantage (spec §4.4).

    python -m experiments.train --config=configs/mt_grpo.py:model=tiny --workdir=runs/mt_grpo

Defaults (Zeng et al. 2025; code: SiliangZeng/Multi-Turn-RL-Agent): λ = 1; the turn reward
is the turn's matched-call similarity to the query's ground-truth calls (greedy one-to-one
matching), and the turn term the
leave-one-out return-to-go of those rewards per turn index ("return_loo"), which stays unbiased
when the policy decides when to stop; the per-turn-index normalisation that verl's RFC #7244
shows biased is `--config.advantage.options.credit=return_per_index`, the paper's two-turn
form `credit=immediate`. GRPO's protocol otherwise (`base.portool_protocol`: independent
groups of n = 8, T_max = 6, the clipped surrogate averaged per trajectory, no KL; the code's
loss averages over tokens). Not measured in training yet; `grid=beyond_smoke` runs it.
"""

from configs import base


def get_config(arg=None):
  return base.estimator_config(arg, "mt_grpo")
