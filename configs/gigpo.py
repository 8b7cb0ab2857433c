"""GiGPO: episode group advantage + step advantage within anchor-state groups (spec §4.4).

    python -m experiments.train --config=configs/gigpo.py:model=tiny --workdir=runs/gigpo

Defaults (Feng et al. 2025, verl-agent): independent groups of n = 8 rollouts, γ = 0.95,
ω = 1, both advantages z-scored ("mean_std_norm"); anchor states are the steps' histories of
tool calls and tool responses (`Rollouts.state_id`, recorded by the episode runner), the
policy's own text ignored. T_max = 6, no KL (`base.portool_protocol`). The episode term's
statistics are the paper's, over trajectories; verl-agent as shipped takes them over step rows
(`--config.advantage.options.episode_stats=step`; see `GiGPOOptions`).
Trained in the credit testbed's grid (`grid=credit`): benchmarks/results/ablation_credit/verdict.md;
its credit on labelled turns: benchmarks/results/credit_fidelity.md and
benchmarks/results/credit_bench_beyond.md.
"""

from configs import base


def get_config(arg=None):
  return base.estimator_config(arg, "gigpo")
