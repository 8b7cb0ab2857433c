"""verl's outcome-level estimators that the seeds' baselines lack (spec §4.4).

reinforce_plus_plus, reinforce_plus_plus_baseline, remax, opo, gpg and grpo_passk, written
from their papers and checked once against verl's own functions (`verl.trainer.ppo.core_algos`;
the commit and the measured differences are in tests/test_verl_estimators.py). Where the spec's
conventions (§3: singletons 0, all-equal groups exactly 0, no NaN on padding) and verl's differ,
the spec's are the default and verl's an option, and the docstring says so.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, get_args

import chex
import jax
import jax.numpy as jnp

from tirjax import option_checks, segments
from tirjax.advantages.group import broadcast_rows, broadcast_tokens
from tirjax.advantages.registry import Advantages, register
from tirjax.rollouts import Rollouts


def _zscore_option(name: str, value) -> None:
  if not isinstance(value, segments.ZScore):
    raise ValueError(f"{name}: must be a segments.ZScore, got {type(value).__name__}")


def _singleton_option(value: str) -> None:
  segments.ZScore(singleton=value)  # validates the value, naming `singleton`


def generated_tokens(r: Rollouts) -> jax.Array:
  """[B, L] bool: the policy's own tokens of valid rows (the loss tokens)."""
  return r.loss_mask & r.row_valid[:, None]


@dataclasses.dataclass(frozen=True)
class ReinforcePPOptions:
  """Attributes:
    gamma: γ of the token-level return (REINFORCE++'s default, and verl's, is 1).
    zscore: conventions of the whitening over the batch's generated tokens (spec §3).
  """

  gamma: float = 1.0
  zscore: segments.ZScore = segments.ZScore()

  def __post_init__(self):
    option_checks.lies_in("gamma", self.gamma, 0, 1)
    _zscore_option("zscore", self.zscore)


def token_returns(r: Rollouts, gamma: float) -> jax.Array:
  """[B, L] G_t = γ^(n_t) · R_out on generated tokens, n_t the row's generated tokens after t.

  The outcome is the reward of the row's last generated token, so the discounted return of
  token t counts the policy's own tokens after it. Tool-response tokens are the environment's,
  not actions: they neither discount nor reset the return. verl's loop resets the return at
  every token outside its response mask ("reset after EOS"), which in a multi-turn row would
  give every step before the last tool response a return of 0; on a single-turn row
  (one contiguous response) the two agree.
  """
  live = generated_tokens(r)
  after = jnp.sum(live, axis=1, keepdims=True) - jnp.cumsum(live, axis=1)
  return jnp.where(live, jnp.power(jnp.float32(gamma), after) * r.outcome[:, None], 0.0)


@register("reinforce_plus_plus", ReinforcePPOptions, spec="4.4",
          loss=dict(aggregation="token_mean"),
          reference="tirjax.testing.reference.verl_baselines:reinforce_plus_plus")
def reinforce_plus_plus(r: Rollouts, opts: ReinforcePPOptions) -> Advantages:
  """REINFORCE++: A_t = whiten(G_t), G_t the token-level discounted return of R_out.

  Hu 2025, "REINFORCE++", §3 (token-level returns, global advantage normalisation); verl's
  `compute_reinforce_plus_plus_outcome_advantage`. Whitening is the z-score of spec §3 over
  every generated token of the batch as one group ((x − mean)/(std + 1e-6), ddof 1; verl:
  (x − mean)·rsqrt(var + 1e-8)), so longer rows weigh more, as in verl. Token-level: with
  γ < 1 a step's tokens differ; `steps` holds each step's mean.
  """
  live = generated_tokens(r)
  tokens = segments.whiten(token_returns(r, opts.gamma), live, opts.zscore)
  return broadcast_tokens(r, tokens, r.outcome)


@dataclasses.dataclass(frozen=True)
class ReinforcePPBaselineOptions:
  """Attributes:
    group: the group baseline R_out − mean (scale "none"), with spec §3's singletons (verl
      subtracts 0 from a singleton: `singleton="raw"`).
    whiten: conventions of the whitening over the batch's generated tokens.
  """

  group: segments.ZScore = segments.ZScore(scale="none")
  whiten: segments.ZScore = segments.ZScore()

  def __post_init__(self):
    _zscore_option("group", self.group)
    _zscore_option("whiten", self.whiten)


@register("reinforce_plus_plus_baseline", ReinforcePPBaselineOptions, spec="4.4",
          group_normalised=True, loss=dict(aggregation="token_mean"),
          reference="tirjax.testing.reference.verl_baselines:reinforce_plus_plus_baseline")
def reinforce_plus_plus_baseline(r: Rollouts, opts: ReinforcePPBaselineOptions) -> Advantages:
  """REINFORCE++-baseline: A = whiten(R_out − mean_g R_out) over the batch's generated tokens.

  Hu 2025, §3.2 (the group mean as baseline, then global normalisation); verl's
  `compute_reinforce_plus_plus_baseline_outcome_advantage`. spec §3's all-equal rule acts
  on the group step (those rows' deviation is exactly 0); the whitening, as in the paper and
  verl, then shifts every token by the batch's token mean, so such rows carry −mean/std
  (small: it comes from rows of unequal length only).
  """
  dev = segments.zscore(r.outcome, r.group_id, r.row_valid, r.num_rows, opts.group)
  live = generated_tokens(r)
  tokens = segments.whiten(jnp.where(live, dev[:, None], 0.0), live, opts.whiten)
  return broadcast_tokens(r, tokens, r.outcome, group_deviation=dev)


@dataclasses.dataclass(frozen=True)
class ReMaxOptions:
  """ReMax has no options: its baseline is a rollout, not a statistic."""


@register("remax", ReMaxOptions, spec="4.4", needs=("greedy_outcome",),
          rollout=dict(greedy_baseline=True),
          reference="tirjax.testing.reference.verl_baselines:remax")
def remax(r: Rollouts, opts: ReMaxOptions) -> Advantages:
  """ReMax: A_j = R_out_j − R_out(greedy rollout of the query).

  Li et al. 2023, "ReMax", Algorithm 1 (the greedy response's reward as the baseline); verl's
  `compute_remax_outcome_advantage`. How the baseline reaches the kernel: the episode runner
  makes one greedy rollout per query (`RolloutOptions.greedy_baseline`: temperature 0, n = 1)
  after the batch's own rows and writes its judged R_out into `Rollouts.greedy_outcome` of
  every row of that query. The greedy rows are never rows of the batch, so they are never in
  the loss, and every estimator sees the same training rows with or without them.
  """
  del opts
  if r.greedy_outcome is None:
    raise ValueError("remax: the batch has no greedy_outcome (Rollouts.greedy_outcome, the "
                     "R_out of one greedy rollout per query); set rollout.greedy_baseline=True")
  chex.assert_shape(r.greedy_outcome, r.row_valid.shape)
  return broadcast_rows(r, r.outcome - r.greedy_outcome, r.outcome,
                        baseline=jnp.where(r.row_valid, r.greedy_outcome, 0.0))


@dataclasses.dataclass(frozen=True)
class OPOOptions:
  singleton: str = "zero"  # a group of one: 0 (spec §3) or its raw R_out (verl)

  def __post_init__(self):
    _singleton_option(self.singleton)


def generated_length(r: Rollouts) -> jax.Array:
  """[B] f32 |τ_j|: the row's generated tokens."""
  return jnp.sum(generated_tokens(r), axis=1).astype(jnp.float32)


@register("opo", OPOOptions, spec="4.4", group_normalised=True,
          reference="tirjax.testing.reference.verl_baselines:opo")
def opo(r: Rollouts, opts: OPOOptions) -> Advantages:
  """OPO: A_j = R_out_j − Σ_k |τ_k| R_k / Σ_k |τ_k| over the group.

  Hao et al. 2025, "On-Policy RL with Optimal Reward Baseline", Eq. 6 (the length-weighted
  mean reward is the variance-optimal baseline); verl's `compute_opo_outcome_advantage`.
  |τ| counts the row's generated tokens. A group whose rows generated no token (Σ|τ| = 0)
  uses the plain mean (the limit of equal weights); then its rows have no tokens to carry it.
  """
  ids, valid, B = r.group_id, r.row_valid, r.num_rows
  length = generated_length(r)
  weighted = segments.segment_sum(length * r.outcome, ids, valid, B)
  total = segments.segment_sum(length, ids, valid, B)
  baseline = jnp.where(total > 0, weighted / jnp.maximum(total, 1.0),
                       segments.segment_mean(r.outcome, ids, valid, B))
  dev = r.outcome - segments.gather(baseline, ids)
  conv = segments.ZScore(singleton=opts.singleton)
  adv = segments.degenerate_groups(dev, r.outcome, ids, valid, B, conv)
  return broadcast_rows(r, adv, r.outcome, baseline=jnp.where(valid, segments.gather(
      baseline, ids), 0.0))


GPGValidRows = Literal["varied_groups", "nonzero_reward"]
_GPG_VALID_ROWS = get_args(GPGValidRows)


@dataclasses.dataclass(frozen=True)
class GPGOptions:
  """Attributes:
    singleton: a group of one: 0 (spec §3) or its raw R_out (verl).
    valid_rows: the M of α = B / M. "varied_groups" (the paper): rows of groups whose
      outcomes are not all equal, the rows that carry a gradient. "nonzero_reward" (verl):
      rows with R_out ≠ 0, which verl counts (`torch.count_nonzero(scores)`).
  """

  singleton: str = "zero"
  valid_rows: GPGValidRows = "varied_groups"

  def __post_init__(self):
    _singleton_option(self.singleton)
    option_checks.one_of("valid_rows", self.valid_rows, _GPG_VALID_ROWS)


@register("gpg", GPGOptions, spec="4.4", group_normalised=True,
          reference="tirjax.testing.reference.verl_baselines:gpg")
def gpg(r: Rollouts, opts: GPGOptions) -> Advantages:
  """GPG: A_j = α · (R_out_j − mean_g R_out), no std, α = B / M.

  Chu et al. 2025, "GPG", §3 (group mean baseline without std normalisation; the gradient
  rescaled by α = B / (B − #rows of all-equal groups), so that groups without a gradient do
  not dilute the batch); verl's `compute_gpg_outcome_advantage` (f_norm = 1). B counts the
  batch's valid rows, never padding; α = 0 when no row counts (every advantage is 0 then).
  """
  ids, valid, B = r.group_id, r.row_valid, r.num_rows
  conv = segments.ZScore(scale="none", singleton=opts.singleton)
  dev = segments.zscore(r.outcome, ids, valid, B, conv)
  if opts.valid_rows == "nonzero_reward":
    counted = valid & (r.outcome != 0)
  else:  # rows of groups that spec §3 does not zero: two or more rows, not all equal
    ones = jnp.ones_like(r.outcome)
    counted = segments.degenerate_groups(ones, r.outcome, ids, valid, B) > 0
  num_counted = jnp.sum(counted)
  alpha = jnp.where(num_counted > 0, jnp.sum(valid) / jnp.maximum(num_counted, 1), 0.0)
  return broadcast_rows(r, alpha * dev, r.outcome, alpha=alpha)


@dataclasses.dataclass(frozen=True)
class PassKOptions:
  zscore: segments.ZScore = segments.ZScore()  # std (ddof) and eps of the scale; singletons

  def __post_init__(self):
    _zscore_option("zscore", self.zscore)


def best_rows(r: Rollouts) -> tuple[jax.Array, jax.Array]:
  """([B] bool, [B] f32): each group's best row (the lowest row index among its rows of
  maximal R_out) and, on it, the group's second-best R_out (the max over its other rows)."""
  ids, valid, B = r.group_id, r.row_valid, r.num_rows
  top = segments.gather(segments.segment_max(r.outcome, ids, valid, B), ids)
  at_top = valid & (r.outcome == top)
  rows = jnp.arange(B)
  first = segments.gather(segments.segment_min(rows, ids, at_top, B, empty=B), ids)
  best = at_top & (rows == first)
  second = segments.gather(segments.segment_max(r.outcome, ids, valid & ~best, B), ids)
  return best, second


@register("grpo_passk", PassKOptions, spec="4.4", group_normalised=True,
          reference="tirjax.testing.reference.verl_baselines:grpo_passk")
def grpo_passk(r: Rollouts, opts: PassKOptions) -> Advantages:
  """pass@k: A = (R_max − R_second)/(std_g + eps) on each group's best row, 0 elsewhere.

  Tang, Zheng, Synnaeve & Munos 2025, "Optimizing Language Models for Inference Time
  Objectives using Reinforcement Learning" (arXiv 2503.19595, the paper verl's code cites;
  not Chen et al.'s "Pass@k Training"): with the group as
  k samples, only the row that decides max_k R is pushed, by its margin over the next best;
  verl's `compute_grpo_passk_outcome_advantage` (which raises on a group of one; here spec §3
  gives it 0). `zscore.scale="none"` drops the std. Tied best rows: the margin is 0, so which
  of them is "best" (the lowest index, as torch.topk's first) changes nothing.
  """
  ids, valid, B = r.group_id, r.row_valid, r.num_rows
  best, second = best_rows(r)
  margin = r.outcome - second
  if opts.zscore.scale == "std":
    std = segments.gather(segments.segment_std(r.outcome, ids, valid, B, opts.zscore.ddof), ids)
    margin = margin / (std + opts.zscore.eps)
  adv = segments.degenerate_groups(jnp.where(best, margin, 0.0), r.outcome, ids, valid, B,
                                   opts.zscore)
  return broadcast_rows(r, adv, r.outcome, best=best)

