"""rloo: the outcome-level group baseline `rloo` (spec §4.3).

    python -m experiments.train --config=configs/rloo.py:model=tiny --workdir=runs/rloo

Defaults: PORTool's protocol for its baselines (`base.portool_protocol`).
Measured with `model=tiny` (ablation snapshot, benchmarks/results/ablation_toolworld/, 128 tasks):
eval accuracy 0.133 ± 0.019 (3 seeds, 8 RL steps) from its warm start's 0.125.
"""

from configs import base


def get_config(arg=None):
  return base.estimator_config(arg, "rloo")
