"""ReMax: R_out minus the R_out of one greedy rollout of the same query (spec §4.4).

    python -m experiments.train --config=configs/remax.py:model=tiny --workdir=runs/remax

Defaults (Li et al. 2023; verl's `remax`): the episode runner also makes one greedy episode per
query (`rollout.greedy_baseline=True`: temperature 0, n = 1), judged like the others; its R_out
is every row's baseline and the episode itself never enters the loss. The rollout stage costs
one greedy episode per query more. PORTool's protocol otherwise (`base.portool_protocol`:
independent groups of n = 8, T_max = 6, the clipped surrogate averaged per trajectory, no KL).
Not in a committed ablation yet (`grid=beyond` runs it); its credit on labelled turns:
benchmarks/results/credit_fidelity.md and benchmarks/results/credit_bench_beyond.md.
"""

from configs import base


def get_config(arg=None):
  return base.estimator_config(arg, "remax")
