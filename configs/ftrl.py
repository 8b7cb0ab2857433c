"""ftrl: a process-reward baseline of HiDiffTIR's comparison (spec §4.3).

    python -m experiments.train --config=configs/ftrl.py:model=tiny --workdir=runs/ftrl

Defaults: HiDiffTIR's protocol for its baselines (`base.hidifftir_protocol`).
Measured with `model=tiny` (ablation snapshot, benchmarks/results/ablation_toolworld/, 128 tasks):
eval accuracy 0.109 ± 0.039 (3 seeds, 8 RL steps) from its warm start's 0.094.
"""

from configs import base


def get_config(arg=None):
  return base.estimator_config(arg, "ftrl")
