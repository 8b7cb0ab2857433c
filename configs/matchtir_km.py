"""matchtir_km: a process-reward baseline of HiDiffTIR's comparison (spec §4.3).

    python -m experiments.train --config=configs/matchtir_km.py:model=tiny --workdir=runs/matchtir_km

Defaults: HiDiffTIR's protocol for its baselines (`base.hidifftir_protocol`).
Measured with `model=tiny`: benchmarks/results/ablation_toolworld/report.md (the ablation
snapshot, row `matchtir_km`).
"""

from configs import base


def get_config(arg=None):
  return base.estimator_config(arg, "matchtir_km")
