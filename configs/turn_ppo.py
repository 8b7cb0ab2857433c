"""Turn-PPO: GAE over turns with a learned critic read at each turn's boundary (spec §4.4).

    python -m experiments.train --config=configs/turn_ppo.py:model=tiny --workdir=runs/turn_ppo

Defaults: PORTool's protocol for its baselines (`base.portool_protocol`: groups of n = 8
independent rollouts, T_max = 6, the clipped surrogate averaged per trajectory, no KL) with
Turn-PPO's γ = 0.99 and λ = 0.9 (arXiv 2512.17008); each turn's advantage is broadcast to its
tokens, and the critic fits one target per turn (its first loss token). The critic is the
`critic` section's, as in configs/ppo.py.
Not measured in a committed ablation yet (`grid=beyond` runs it).
"""

from configs import base


def get_config(arg=None):
  return base.estimator_config(arg, "turn_ppo")
