"""PPO with a learned critic: token-level GAE over each row's loss tokens (spec §4.4).

    python -m experiments.train --config=configs/ppo.py:model=tiny --workdir=runs/ppo

Defaults: PORTool's protocol for its baselines (`base.portool_protocol`): groups of n = 8
independent rollouts (the groups only batch the queries; GAE reads no group statistics),
T_max = 6, the clipped surrogate averaged per trajectory, no KL; verl's GAE (γ = λ = 1,
advantages whitened over the batch's loss tokens). The critic (`critic` section): a copy of
the policy's trunk with a zero value head as RL starts, its own AdamW (`critic.optim`), the
clipped value loss (`critic.cliprange_value` 0.5, the loss's aggregation), `critic.critic_warmup`
RL steps in which only the critic updates (0 by default, as verl's).
Not measured in a committed ablation yet (`grid=beyond` runs it).
"""

from configs import base


def get_config(arg=None):
  return base.estimator_config(arg, "ppo")
