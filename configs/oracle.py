"""oracle: per-turn advantages from the environment's ground-truth turn labels (spec §4.4).

    python -m experiments.train --config=configs/oracle.py:model=tiny --workdir=runs/oracle

A positive control, not a method: +1 on every token of a right turn, −1 on a wrong one, read
from the labels the environment gives each turn (`Rollouts.turn_label`, from its registry
entry's `turn_labels`; toolworld only), so it runs on environments that label turns and is
refused, naming the environment, before any compute on the others. GRPO's protocol otherwise
(`base.portool_protocol`, as configs/grpo.py: independent groups of n = 8, T_max = 6, the
clipped surrogate averaged per trajectory, no KL), so that the advantage is all that differs
from the `grpo` cell and GRPO's learning rate carries over (its advantages have the same
per-token scale). In an ablation it is the upper bound of what per-turn credit buys: if it does
not beat GRPO there, the testbed cannot show a credit effect (configs/ablate.py:
`grid=credit_oracle`, `grid=credit12_oracle`). Its `credit/*` metrics are at their bounds
(`credit/auc` 1, `credit/wrong_negative` 1, `credit/no_signal` 0) by construction; they check
the labels' plumbing, not the estimator. Not measured yet.
"""

from configs import base


def get_config(arg=None):
  return base.estimator_config(arg, "oracle")
