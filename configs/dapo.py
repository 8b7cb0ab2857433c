"""DAPO: clip-higher, dynamic sampling, token-mean loss, overlong shaping (spec §4.3).

    python -m experiments.train --config=configs/dapo.py:model=tiny --workdir=runs/dapo

Defaults (Yu et al. 2025): ε_low = 0.2, ε_high = 0.28, token-mean aggregation, no KL; groups
whose rewards are all equal are filtered and the batch is refilled with more queries (up to
`train.dynamic_sampling_tries` extra rounds); overlong shaping with L_max, L_cache scaled to the
per-row token budget. Independent groups of n = 8, T_max = 6.
Measured with `model=tiny`: benchmarks/results/ablation_toolworld/report.md (the ablation
snapshot, row `dapo`).
"""

from configs import base


def get_config(arg=None):
  c = base.estimator_config(arg, "dapo")
  # Live references: an override of rollout.max_steps or max_new_tokens moves L_max and L_cache.
  generated = c.rollout.get_ref("max_steps") * c.rollout.get_ref("max_new_tokens")
  c.advantage.options.max_response_tokens = generated
  c.advantage.options.overlong_cache = generated // 5
  return c
