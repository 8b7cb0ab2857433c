"""matchtir_ot: a process-reward baseline of HiDiffTIR's comparison (SPEC §4.3).

    python -m experiments.train --config=configs/matchtir_ot.py:model=tiny --workdir=runs/matchtir_ot

Defaults as HiDiffTIR trains its baselines (§4.1, App. A.5): groups of 16 independent rollouts
at temperature 1.0, at most 10 turns, answers in `<answer>` tags; KL 0.001 (k3), entropy
0.001, lr 1e-6 (scaled to the model by the tiny preset).
Measured with `model=tiny` (hidifftir, seeds 0-2; benchmarks/results/default_run.json): the SFT
warm start reaches 0.27-0.42 greedy eval accuracy and 40 RL steps add +0.008 to +0.023, within
eval noise; the papers report their gains on 1.7B-7B models.
"""

from configs import base


def get_config(arg=None):
  return base.make(arg, estimator="matchtir_ot",
                   rollout=dict(mode="independent", n=16, max_steps=10, temperature=1.0,
                                answer_protocol="answer_tag", shapes=dict(max_steps=10)),
                   loss=dict(kl_coef=0.001, kl_estimator="k3", entropy_coef=0.001),
                   optim=dict(learning_rate=1e-6))
