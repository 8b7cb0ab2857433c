"""OPO: R_out minus the length-weighted group mean Σ|τ|R / Σ|τ| (spec §4.4).

    python -m experiments.train --config=configs/opo.py:model=tiny --workdir=runs/opo

Defaults (Hao et al. 2025; verl's `opo`): |τ| the row's generated tokens; PORTool's protocol
otherwise (`base.portool_protocol`: independent groups of n = 8, T_max = 6, the clipped
surrogate averaged per trajectory, no KL). OPO trains exactly on-policy (one update per rollout
batch), which is the trainer's default.
Not in a committed ablation yet (`grid=beyond` runs it); its credit on labelled turns:
benchmarks/results/credit_fidelity.md and benchmarks/results/credit_bench_beyond.md.
"""

from configs import base


def get_config(arg=None):
  return base.estimator_config(arg, "opo")
