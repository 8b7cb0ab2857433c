"""REINFORCE++: token-level discounted returns of R_out, whitened over the batch (spec §4.4).

    python -m experiments.train --config=configs/reinforce_plus_plus.py:model=tiny \
        --workdir=runs/reinforce_plus_plus

Defaults (Hu 2025; verl's `reinforce_plus_plus`): γ = 1, whitening over every generated token
of the batch, the token-mean loss (the paper's token-level objective); PORTool's protocol
otherwise (`base.portool_protocol`: independent groups of n = 8, T_max = 6, no KL).
Not in a committed ablation yet (`grid=beyond` runs it); its credit on labelled turns:
benchmarks/results/credit_fidelity.md and benchmarks/results/credit_bench_beyond.md.
"""

from configs import base


def get_config(arg=None):
  return base.estimator_config(arg, "reinforce_plus_plus")
