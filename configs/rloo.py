"""rloo: the outcome-level group baseline `rloo` (spec §4.3).

    python -m experiments.train --config=configs/rloo.py:model=tiny --workdir=runs/rloo

Defaults: PORTool's protocol for its baselines (`base.portool_protocol`).
Measured with `model=tiny`: benchmarks/results/ablation_toolworld/report.md (the ablation
snapshot, row `rloo`).
"""

from configs import base


def get_config(arg=None):
  return base.estimator_config(arg, "rloo")
