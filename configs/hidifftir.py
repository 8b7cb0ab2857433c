"""HiDiffTIR: matched tool calls, difficulty-aware trajectory and turn credit (SPEC §4.2).

    python -m experiments.train --config=configs/hidifftir.py:model=tiny --workdir=runs/hidifftir

Paper defaults (HiDiffTIR §4.1, App. A.5): groups of 16 independent rollouts at temperature
1.0, at most 10 turns, answers in `<answer>` tags, α = 0.7, λ = 1, exact (Hungarian) matching;
lr 1e-6, KL 0.001 (k3), entropy bonus 0.001. The tiny preset keeps the method's credit
assignment (α, λ, matching, the answer protocol) but not its budget: T_max = 6 turns (toolworld
needs at most 4 tool steps and the answer), 64 new tokens per turn, 3 queries per step, and
learning rates scaled to the model (configs/base.py, `tiny`).
Measured with `model=tiny` (hidifftir, seeds 0-2; benchmarks/results/default_run.json): the SFT
warm start reaches 0.27-0.42 greedy eval accuracy and 40 RL steps add +0.008 to +0.023, within
eval noise; the papers report their gains on 1.7B-7B models.
"""

from configs import base


def get_config(arg=None):
  return base.make(arg, estimator="hidifftir",
                   rollout=dict(mode="independent", n=16, max_steps=10, temperature=1.0,
                                answer_protocol="answer_tag", shapes=dict(max_steps=10)),
                   loss=dict(kl_coef=0.001, kl_estimator="k3", entropy_coef=0.001),
                   optim=dict(learning_rate=1e-6))
