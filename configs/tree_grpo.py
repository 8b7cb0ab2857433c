"""Tree-GRPO: intra-tree + inter-tree group advantages on rollout trees (spec §4.4).

    python -m experiments.train --config=configs/tree_grpo.py:model=tiny --workdir=runs/tree_grpo

Defaults: PORTool's tree sampler (Algorithm 1: n = 8 rows, branching f = 2, T_max = 6), so that
Tree-GRPO and PORTool train on the same trees; each of the query's first steps roots one tree
(Ji et al. 2025 grow M trees from M independent starts). Both z-scores as spec §3; the clipped
surrogate averaged per trajectory, no KL.
Not in a committed ablation yet (`grid=beyond` runs it); its credit on labelled turns:
benchmarks/results/credit_fidelity.md and benchmarks/results/credit_bench_beyond.md.
"""

from configs import base


def get_config(arg=None):
  return base.estimator_config(arg, "tree_grpo")
