"""grpo: the outcome-level group baseline `grpo` (SPEC §4.3).

    python -m experiments.train --config=configs/grpo.py:model=tiny --workdir=runs/grpo

Defaults: PORTool's protocol for its baselines (`base.portool_protocol`).
Measured with `model=tiny` (ablation snapshot, benchmarks/results/ablation_toolworld/, 128 tasks):
eval accuracy 0.133 ± 0.019 (3 seeds, 8 RL steps) from its warm start's 0.125.
On the default's protocol (`configs/ablate.py:grid=default`, benchmarks/results/ablation_default/,
256 tasks): greedy accuracy gains +0.078/+0.184/+0.188 over 40 RL steps (seeds 0-2) from warm starts
0.344/0.301/0.289 (1200 SFT steps, a Zen 5 EPYC).
"""

from configs import base


def get_config(arg=None):
  return base.make(arg, estimator="grpo", **base.portool_protocol())
