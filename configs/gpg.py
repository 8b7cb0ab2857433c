"""GPG: R_out − group mean without std, rescaled by rows / rows of varied groups (spec §4.4).

    python -m experiments.train --config=configs/gpg.py:model=tiny --workdir=runs/gpg

Defaults (Chu et al. 2025; verl's `gpg`): α = B / (B − rows of all-equal groups)
(`advantage.options.valid_rows=nonzero_reward` counts as verl does); no KL. GPG's loss is the
plain policy gradient, which the clipped surrogate equals at one update per rollout batch (the
trainer's default). PORTool's protocol otherwise (`base.portool_protocol`: independent groups
of n = 8, T_max = 6).
Not in a committed ablation yet (`grid=beyond` runs it); its credit on labelled turns:
benchmarks/results/credit_fidelity.md and benchmarks/results/credit_bench_beyond.md.
"""

from configs import base


def get_config(arg=None):
  return base.estimator_config(arg, "gpg")
