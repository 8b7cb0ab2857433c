"""GiGPO: episode group advantage + step advantage within anchor-state groups (spec §4.4).

    python -m experiments.train --config=configs/gigpo.py:model=tiny --workdir=runs/gigpo

Defaults (Feng et al. 2025, verl-agent): independent groups of n = 8 rollouts, γ = 0.95,
ω = 1, both advantages z-scored ("mean_std_norm"); anchor states are the steps' histories of
tool calls and tool responses (`Rollouts.state_id`, recorded by the episode runner), the
policy's own text ignored. T_max = 6, no KL (`base.portool_protocol`). The episode term's
statistics are the paper's, over trajectories; verl-agent as shipped takes them over step rows
(`--config.advantage.options.episode_stats=step`; see `GiGPOOptions`).
Not in the ablation snapshot (benchmarks/results/ablation_toolworld/, older); expected, as
there: within eval noise (±0.02) of its warm start after 8 RL steps (`grid=beyond_smoke` runs it).
"""

from configs import base


def get_config(arg=None):
  return base.estimator_config(arg, "gigpo")
