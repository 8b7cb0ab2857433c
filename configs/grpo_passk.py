"""pass@k: only each group's best row is pushed, by its margin over the next best (spec §4.4).

    python -m experiments.train --config=configs/grpo_passk.py:model=tiny --workdir=runs/grpo_passk

Defaults (Tang, Zheng, Synnaeve & Munos 2025, arXiv 2503.19595, as verl's `grpo_passk`
implements it): the margin divided by the group's std (ddof 1); the group of n = 8 rows is the
k samples. PORTool's protocol otherwise
(`base.portool_protocol`: independent groups, T_max = 6, no KL).
Not in a committed ablation yet (`grid=beyond` runs it); its credit on labelled turns:
benchmarks/results/credit_fidelity.md and benchmarks/results/credit_bench_beyond.md.
"""

from configs import base


def get_config(arg=None):
  return base.estimator_config(arg, "grpo_passk")
