"""EMPG: GRPO's outcome advantage scaled per turn by the policy's certainty, plus a bonus for a
certain next turn (spec §4.4, Wang et al. 2025).

    python -m experiments.train --config=configs/empg.py:model=tiny --workdir=runs/empg

Defaults (the project page's pseudocode; the paper has no public code): k = k_f = 1, ζ = 0.1,
the modulated step advantages centred over the batch. The uncertainty of a turn is the mean
surprisal of its sampled tokens under the sampler (`Rollouts.old_logprobs`); every other open
choice is listed in `tirjax/advantages/empg.py`. Independent groups of n = 8, T_max = 6, no KL
(`base.portool_protocol`). Not yet run in an ablation.
"""

from configs import base


def get_config(arg=None):
  return base.make(arg, estimator="empg", **base.portool_protocol())
