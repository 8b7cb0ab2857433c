"""GDPO: each reward z-scored within its group, summed, normalised over the batch (spec §4.4).

    python -m experiments.train --config=configs/gdpo.py:model=tiny --workdir=runs/gdpo

Defaults (Liu et al. 2026, a drop-in replacement of GRPO's advantage): the rewards R_out and
the mean formatting reward (the pair `grpo_fm` sums before normalising), weights 1, the batch
step over rows with eps 1e-4 (GDPO's TRL code); GRPO's protocol otherwise
(`base.portool_protocol`: independent groups of n = 8, T_max = 6, the clipped surrogate
averaged per trajectory, no KL). verl's variant whitens over tokens:
`--config.advantage.options.batch_norm=tokens`. Not measured in training yet;
`grid=beyond_smoke` runs it.
"""

from configs import base


def get_config(arg=None):
  return base.estimator_config(arg, "gdpo")
