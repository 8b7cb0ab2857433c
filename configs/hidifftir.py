"""HiDiffTIR: matched tool calls, difficulty-aware trajectory and turn credit (SPEC §4.2).

    python -m experiments.train --config=configs/hidifftir.py:model=tiny --workdir=runs/hidifftir

Paper defaults (HiDiffTIR §4.1, App. A.5): groups of 16 independent rollouts at temperature
1.0, at most 10 turns, answers in `<answer>` tags, α = 0.7, λ = 1, exact (Hungarian) matching;
lr 1e-6, KL 0.001 (k3), entropy bonus 0.001. The tiny preset keeps the method's credit
assignment (α, λ, matching, the answer protocol) but not its budget: T_max = 6 turns (toolworld
needs at most 4 tool steps and the answer), 64 new tokens per turn, 3 queries per step, and
learning rates scaled to the model (configs/base.py, `tiny`).
Measured with `model=tiny` (`make run`, seeds 0-2, benchmarks/results/default_run.json):
greedy eval accuracy 0.297/0.438/0.277 after SFT, -0.008/0.000/0.000 after 40 RL steps.
"""

from configs import base


def get_config(arg=None):
  return base.make(arg, estimator="hidifftir", **base.hidifftir_protocol())
