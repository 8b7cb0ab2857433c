"""grpo: the outcome-level group baseline `grpo` (spec §4.3).

    python -m experiments.train --config=configs/grpo.py:model=tiny --workdir=runs/grpo

Defaults: PORTool's protocol for its baselines (`base.portool_protocol`).
Measured with `model=tiny`: benchmarks/results/ablation_toolworld/report.md (the ablation
snapshot) and benchmarks/results/ablation_default/report.md (the default's protocol).
"""

from configs import base


def get_config(arg=None):
  return base.estimator_config(arg, "grpo")
