"""grpo_fm: the outcome-level group baseline `grpo_fm` (spec §4.3).

    python -m experiments.train --config=configs/grpo_fm.py:model=tiny --workdir=runs/grpo_fm

Defaults: PORTool's protocol for its baselines (`base.portool_protocol`).
Measured with `model=tiny`: benchmarks/results/ablation_toolworld/report.md (the ablation
snapshot, row `grpo_fm`).
"""

from configs import base


def get_config(arg=None):
  return base.estimator_config(arg, "grpo_fm")
