"""OTB: per-token group baselines B_p = Σ G·W / Σ W at each response position (spec §4.4).

    python -m experiments.train --config=configs/optimal_token_baseline.py:model=tiny \
        --workdir=runs/optimal_token_baseline

Defaults (verl's `optimal_token_baseline`, docs/algo/otb.md, whose example trains with verl's
defaults): groups of n = 8 rows and the token-mean loss, no KL; PORTool's protocol otherwise
(`base.portool_protocol`: independent rollouts, T_max = 6). The energy is the sampled proxy
1 − π(a) (`OTBOptions.energy`): the trainer's samplers record no Σ_v π(v)², which verl's
energy reads. On multi-turn rows `tir_optimal_token_baseline` lines turns up; this one counts
tool-response tokens as positions, as verl's does. Not measured in training yet;
`grid=beyond_smoke` runs it.
"""

from configs import base


def get_config(arg=None):
  return base.estimator_config(arg, "optimal_token_baseline")
