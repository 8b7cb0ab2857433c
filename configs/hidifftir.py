"""HiDiffTIR: matched tool calls, difficulty-aware trajectory and turn credit (spec §4.2).

    python -m experiments.train --config=configs/hidifftir.py:model=tiny --workdir=runs/hidifftir

Paper defaults (HiDiffTIR §4.1, App. A.5): groups of 16 independent rollouts at temperature
1.0, at most 10 turns, answers in `<answer>` tags, α = 0.7, λ = 1, exact (Hungarian) matching;
lr 1e-6, KL 0.001 (k3), entropy bonus 0.001. The tiny preset keeps the method's credit
assignment (α, λ, matching, the answer protocol) but not its budget: T_max = 6 turns, 64 new
tokens per turn, 8 queries x 6 rows at T = 0.6 in 4 mini-batches, 40 steps, on a warm start
designed to leave RL a lever (toolworld's preset `toolworld_headroom`).
Measured with `model=tiny` (`make run`, 3 seeds, with the CPU it ran on):
benchmarks/results/default_run.json (docs/results.md reads it).
"""

from configs import base


def get_config(arg=None):
  return base.estimator_config(arg, "hidifftir")
