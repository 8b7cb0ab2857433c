"""toolrl: a process-reward baseline of HiDiffTIR's comparison (spec §4.3).

    python -m experiments.train --config=configs/toolrl.py:model=tiny --workdir=runs/toolrl

Defaults: HiDiffTIR's protocol for its baselines (`base.hidifftir_protocol`).
Measured with `model=tiny`: benchmarks/results/ablation_toolworld/report.md (the ablation
snapshot, row `toolrl`).
"""

from configs import base


def get_config(arg=None):
  return base.estimator_config(arg, "toolrl")
