"""IGPO: turn rewards from the policy's information gain about the gold answer (spec §4.4).

Wang et al. 2025, "Information Gain-based Policy Optimization: A Simple and Effective Approach
for Multi-Turn LLM Agents" (arXiv 2510.14967; no public code). With P_t = π_θ(a | q, o_{≤t})
the policy's length-normalised probability of the gold answer a after turns 1..t,
exp((1/|a|) Σ_j log π_θ(a_j | q, o_{≤t}, a_{<j})), each turn of row i gets

    r_{i,t} = P_t − P_{t−1}  (t < T_i),     r_{i,T_i} = the outcome reward,
    r̃ = z(r) over the group's rewards,       A_{i,t} = Σ_{k=t}^{T_i} γ^{k−t} r̃_{i,k},

and A_{i,t} goes to every generated token of turn t. The probabilities come from
`Rollouts.answer_logprob` [B, T]: entry t is log P before step t (0-based: the prompt and steps
0..t-1), so step t < n−1 has r = exp(lp[t+1]) − exp(lp[t]) and the last step's reward is the
outcome; the trainer computes them in one packed forward per batch, each row's probes
branches off its history (`tirjax/train_steps/answer_probe.py`).

Choices the paper leaves open (or that this contract forces), decided here:

* **The normalisation's pool** (`normalise`). "group" (the default, the paper's reading: one
  z-score over the set of all turn rewards of the query's G rollouts, information gains and
  outcome rewards mixed) or "turn_index" (a z-score among the group's rows at each turn index,
  as MT-GRPO's `immediate`). Either way the return then sums the normalised rewards, so a row
  with more turns left collects more −mean terms: the length dependence verl's RFC #7244
  describes for MT-GRPO's `return_per_index` is also in the paper's IGPO, and it is kept (the
  estimator is the paper's), not corrected.
* **The final reward** (`final_reward`): the paper's is an answer F1 (with a format penalty);
  here "outcome" (R_out ∈ {−1, 0, +1}, the default, as every estimator of tirjax) or
  "answer_score" (`Rollouts.answer_score` ∈ [0, 1], the judge's graded score, the nearest to an
  F1). The last valid step of every row gets it, answered or truncated: a truncated row's last
  turn is scored by its outcome, not by a gain, as the paper's last turn always is.
* **γ** (`gamma`, default 1: the undiscounted return; the paper's γ is a hyper-parameter).
* **The probability** is the geometric mean over the answer's tokens (the paper's 1/|a|), read
  under the current policy before the update (the trainer's parameters at sampling time, so the
  rewards are fixed for the step's epochs); the answer is teacher-forced after the history and
  the environment's answer template (the probe's prefix, `answer_probe.py`).
* **Degenerate pools** follow spec §3 (`zscore`): a pool of one reward gets 0, a pool of equal
  rewards exactly 0. A row with a single turn has only the outcome reward; a group of one row
  with several turns is normalised over its own turns' rewards ("group"), since the pool is the
  set of rewards, not of rows. On a tree, a shared step enters the pool once per row through
  it (its rows share its probe, so its reward), as in every per-row estimator here.
* `rows` is A_{i,0}, the row's first turn's return (logged); `row_reward` is the final reward.

The kernel against its loop: benchmarks/results/bench_kernels_igpo_cpu.md.
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp

from tirjax import option_checks, segments
from tirjax.advantages import turns
from tirjax.advantages.group import broadcast_steps
from tirjax.advantages.registry import Advantages, register
from tirjax.rollouts import Rollouts

NORMALISE = ("group", "turn_index")
FINAL_REWARDS = ("outcome", "answer_score")


@dataclasses.dataclass(frozen=True)
class IGPOOptions:
  """Attributes (module docstring for each choice):
    gamma: γ of the turn return Σ_{k ≥ t} γ^{k−t} r̃_k, in [0, 1].
    normalise: the pool of the z-score: "group" (all turn rewards of the query's rows) or
      "turn_index" (the query's rows at one turn index).
    final_reward: the last turn's reward: "outcome" (R_out) or "answer_score".
    zscore: spec §3's conventions of that z-score.
  """

  gamma: float = 1.0
  normalise: str = "group"
  final_reward: str = "outcome"
  zscore: segments.ZScore = segments.ZScore()

  def __post_init__(self):
    option_checks.finite_at_least("gamma", self.gamma, 0.0)
    if self.gamma > 1.0:
      raise ValueError(f"gamma: must lie in [0, 1], got {self.gamma}")
    option_checks.one_of("normalise", self.normalise, NORMALISE)
    option_checks.one_of("final_reward", self.final_reward, FINAL_REWARDS)
    if not isinstance(self.zscore, segments.ZScore):
      raise ValueError(f"zscore: must be a segments.ZScore, got {type(self.zscore).__name__}")


def last_steps(r: Rollouts) -> jax.Array:
  """[B, T] bool: each valid row's last valid step (answered or not)."""
  t = jnp.arange(r.max_steps)[None, :]
  return (t == r.num_steps[:, None] - 1) & r.step_valid & r.row_valid[:, None]


def information_gain(r: Rollouts) -> jax.Array:
  """[B, T] IG_t = P(a | history through step t) − P(a | history before step t), P = exp(lp):
  exp(lp[t+1]) − exp(lp[t]); 0 at the last column (its successor probe is never taken)."""
  p = jnp.exp(r.answer_logprob.astype(jnp.float32))
  nxt = jnp.concatenate([p[:, 1:], jnp.zeros_like(p[:, :1])], axis=1)
  return nxt - p


def turn_rewards(r: Rollouts, final_reward: str) -> jax.Array:
  """[B, T] r_{i,t}: the information gain, the final reward on the last step, 0 on padding."""
  final = r.outcome if final_reward == "outcome" else r.answer_score
  reward = jnp.where(last_steps(r), final[:, None], information_gain(r))
  return jnp.where(r.step_valid & r.row_valid[:, None], reward, 0.0)


def normalised(r: Rollouts, rewards: jax.Array, opts: IGPOOptions) -> jax.Array:
  """[B, T] r̃: z-scores of the rewards over `opts.normalise`'s pools."""
  if opts.normalise == "turn_index":
    ids, mask, n = turns.turn_segments(r)
  else:
    mask = r.step_valid & r.row_valid[:, None]
    ids, n = jnp.broadcast_to(r.group_id[:, None], mask.shape), r.num_rows
  return jnp.where(mask, segments.zscore(rewards, ids, mask, n, opts.zscore), 0.0)


def discounted_returns(x: jax.Array, mask: jax.Array, gamma: float) -> jax.Array:
  """[B, T] Σ_{k ≥ t} γ^{k−t} x_k over the row's valid steps, as one [T, T] matrix product."""
  chex.assert_equal_shape([x, mask])
  T = x.shape[1]
  lag = jnp.arange(T)[None, :] - jnp.arange(T)[:, None]  # [t, k] = k − t
  # γ = 0 keeps γ^0 = 1 on the diagonal (jnp.power(0., 0) is 1).
  weight = jnp.where(lag >= 0, jnp.power(jnp.float32(gamma), jnp.maximum(lag, 0)), 0.0)
  x = jnp.where(mask, x, 0.0)
  # Exact float32 (an accelerator's default matmul may round through TF32 / bf16).
  return jnp.where(mask, jnp.matmul(x, weight.T, precision=jax.lax.Precision.HIGHEST), 0.0)


@register("igpo", IGPOOptions, spec="4.4", needs=("answer_logprob",),
          reference="tirjax.testing.reference.igpo:igpo")
def igpo(r: Rollouts, opts: IGPOOptions) -> Advantages:
  """IGPO: A_{i,t} = Σ_{k ≥ t} γ^{k−t} z(r)_{i,k}, r the information gain of each turn and the
  final reward on the last (Wang et al. 2025, arXiv 2510.14967, §3: turn-level information
  gain reward, its group normalisation and discounted accumulation). The module docstring lists
  the choices the paper leaves open."""
  if r.answer_logprob is None:
    raise ValueError("igpo: the batch has no answer_logprob (Rollouts.answer_logprob, the "
                     "policy's log-probability of the gold answer before each turn); the "
                     "trainer fills it only for igpo, on an environment with gold answers")
  chex.assert_equal_shape([r.answer_logprob, r.step_valid])  # [B, T]
  chex.assert_type(r.answer_logprob, jnp.floating)
  rewards = turn_rewards(r, opts.final_reward)
  norm = normalised(r, rewards, opts)
  mask = r.step_valid & r.row_valid[:, None]
  steps = discounted_returns(norm, mask, opts.gamma)
  final = r.outcome if opts.final_reward == "outcome" else r.answer_score
  return broadcast_steps(r, steps, jnp.where(r.num_steps > 0, steps[:, 0], 0.0), final,
                         turn_reward=rewards, normalised_reward=norm,
                         information_gain=jnp.where(mask & ~last_steps(r),
                                                    information_gain(r), 0.0))
