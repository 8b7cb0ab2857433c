"""The policy objective: clipped surrogate + KL to a reference − entropy bonus (spec §5).

    opts = LossOptions(clip_high=0.28)                  # DAPO's clip-higher
    out = jax.jit(policy_loss, static_argnames="opts")(
        logprobs, old_logprobs, advantages, loss_mask, row_mask, opts=opts)
    grads = jax.grad(lambda p: policy_loss(logp_fn(p), ...).loss.sum)(params)
    # over micro-batches and devices: Σ grads / Σ out.loss.den is the full-batch gradient

Per token (`mask = loss_mask ∧ row_mask`):
    ρ     = exp(clamp(logp − old_logp, ±20))        (GSPO-token ratio with ratio_level="sequence")
    pg    = −min(ρA, clip(ρ, 1 − ε_low, 1 + ε_high)A);  for A < 0 with dual clip: min(pg, −cA)
          = −sg(clip(ρ, 1 − ε_low, 1 + ε_high)) · A · logp   with surrogate="cispo"
    total = pg + β·KL_k(π_θ ‖ π_ref) − c_H·H
each aggregated with the configured mode into `Mean(sum, den)` (see `aggregation`). With a
rollout correction (`rollout_correction`, TIS / MIS, off by default) pg is weighted per token
and rows are dropped from the mask (see `tirjax.loss.rollout_correction`).
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Optional, get_args

import chex
import flax.struct
import jax
import jax.numpy as jnp

from tirjax import option_checks
from tirjax.loss import kl as kl_lib
from tirjax.loss import ratio as ratio_lib
from tirjax.loss import rollout_correction as rollout_correction_lib
from tirjax.loss import surrogate
from tirjax.loss import aggregation as aggregation_modes
from tirjax.loss.diagnostics import loss_diagnostics
from tirjax.loss.stats import Mean, Stat
from tirjax.rollouts import Advantages, Rollouts

# The choices of the fields below, typed so that `--print_config` lists them.
RatioLevel = Literal["token", "sequence"]
Surrogate = Literal["clip", "cispo"]
KLEstimator = Literal[kl_lib.ESTIMATORS]
RATIO_LEVELS = get_args(RatioLevel)
SURROGATES = get_args(Surrogate)


@dataclasses.dataclass(frozen=True)
class LossOptions:
  """Options of the policy loss; defaults are spec §5's (PORTool / GRPO).

  Attributes:
    clip_low: ε_low, the ratio's lower bound is 1 − ε_low (DAPO: 0.2).
    clip_high: ε_high, the upper bound is 1 + ε_high (DAPO: 0.28).
    dual_clip: c > 1 of the dual clip for negative advantages (usually 3.0); None: off.
    ratio_level: "token" (PPO) or "sequence" (GSPO's length-normalised sequence ratio, in
      its GSPO-token form).
    surrogate: "clip" (PPO's clipped surrogate) or "cispo" (MiniMax-M1: the clipped ratio,
      stop-gradiented, weighs A · log π, so no token's gradient is dropped; spec §4.4). They
      differ only where ρ ≠ 1, i.e. from the second update on one rollout batch. With
      "cispo" ε_low may be ≥ 1 (no lower bound on the weight) and the dual clip is refused.
      Its terms are aggregated by `aggregation` like every surrogate's, by default
      `seq_mean_token_mean`; MiniMax-M1 normalises by Σ|o_i| over the batch's tokens, which is
      `aggregation="token_mean"`: set it for the paper's CISPO.
    kl_coef: β of the KL to the reference policy (0 for PORTool, 0.001 for HiDiffTIR).
    kl_estimator: "k1", "k2" or "k3" (see `tirjax.loss.kl`).
    kl_clamp: k3's value is clamped to [−kl_clamp, kl_clamp] (verl's `low_var_kl`: 10);
      0 turns the clamp off.
    entropy_coef: weight of the entropy bonus (subtracted from the loss).
    aggregation: a mode of `tirjax.loss.aggregation.MODES` (its record says how it reduces
      and what it needs).
    norm_constant: the fixed divisor of a mode that needs one (`seq_mean_token_sum_norm`; e.g.
      the configured max generation length); required by it, unused by the others.
    rollout_correction: TIS / MIS against the sampler–trainer mismatch
      (`tirjax.loss.rollout_correction`); off by default. On, the trainer recomputes π_old and
      the loss needs the sampler's log-probs (`sampler_logprobs`).
  """

  clip_low: float = 0.2
  clip_high: float = 0.2
  dual_clip: Optional[float] = None
  ratio_level: RatioLevel = "token"
  surrogate: Surrogate = "clip"
  kl_coef: float = 0.0
  kl_estimator: KLEstimator = "k3"
  kl_clamp: float = kl_lib.K3_CLAMP
  entropy_coef: float = 0.0
  aggregation: str = "seq_mean_token_mean"
  norm_constant: Optional[float] = None
  rollout_correction: rollout_correction_lib.RolloutCorrectionOptions = (
      rollout_correction_lib.RolloutCorrectionOptions())

  def __post_init__(self):
    option_checks.one_of("surrogate", self.surrogate, SURROGATES)
    cispo = self.surrogate == "cispo"
    if cispo:
      option_checks.finite_at_least("clip_low", self.clip_low, 0, why="with cispo")
    else:
      option_checks.lies_in("clip_low", self.clip_low, 0, 1, open_high=True)
    option_checks.finite_at_least("clip_high", self.clip_high, 0)
    option_checks.finite_above("dual_clip", self.dual_clip, 1, none_ok=True)
    if cispo and self.dual_clip is not None:
      raise ValueError("dual_clip: the cispo surrogate has no clipped branch to cap; set None")
    option_checks.one_of("ratio_level", self.ratio_level, RATIO_LEVELS)
    option_checks.finite_at_least("kl_coef", self.kl_coef, 0)
    option_checks.one_of("kl_estimator", self.kl_estimator, kl_lib.ESTIMATORS)
    option_checks.finite_at_least("kl_clamp", self.kl_clamp, 0, why="0 = off")
    option_checks.finite_at_least("entropy_coef", self.entropy_coef, 0)
    aggregation_modes.check_options(self.aggregation, self.norm_constant)


@flax.struct.dataclass(frozen=True)
class LossOutput:
  """Each term as `Mean(sum, den)` under the configured aggregation (one shared `den`).

  To accumulate: add `∇ loss.sum` and `loss.den` over micro-batches (and devices), then
  divide once, guarding an all-masked step: `grads / max(Σ den, 1)` (its gradient is 0).

  Attributes:
    loss: the objective to minimise, `pg + β·kl − c_H·entropy`; differentiate `loss.sum`.
    pg: the clipped surrogate.
    kl: KL to the reference (present when `ref_logprobs` is given, even with β = 0).
    entropy: the policy entropy (present when `entropy` is given).
    metrics: diagnostics over loss tokens (see `tirjax.loss.diagnostics`).
  """

  loss: Mean
  pg: Mean
  kl: Optional[Mean]
  entropy: Optional[Mean]
  metrics: dict[str, Stat]


def policy_loss(logprobs: jax.Array, old_logprobs: jax.Array, advantages: jax.Array,
                loss_mask: jax.Array, row_mask: jax.Array, opts: LossOptions = LossOptions(),
                *, ref_logprobs: Optional[jax.Array] = None,
                entropy: Optional[jax.Array] = None,
                sampler_logprobs: Optional[jax.Array] = None) -> LossOutput:
  """The policy loss of a batch as accumulable `(sum, den)` pairs.

  Args:
    logprobs: [B, L] log-probs of the sampled tokens under the current policy.
    old_logprobs: [B, L] under the behaviour policy (the sampler's).
    advantages: [B, L] token advantages (`Advantages.tokens`).
    loss_mask: [B, L] bool, generated tokens (`Rollouts.loss_mask`).
    row_mask: [B] bool, rows that enter the loss (`Advantages.row_mask`).
    opts: `LossOptions` (static under `jit`).
    ref_logprobs: [B, L] under the reference policy; required when `opts.kl_coef > 0`.
    entropy: [B, L] per-token entropy of the current policy; required when
      `opts.entropy_coef > 0`.
    sampler_logprobs: [B, L] the sampler's own log-probs, `old_logprobs` then being the
      trainer's recomputed π_old; required when `opts.rollout_correction` is on.

  Values outside the mask are ignored (NaN or Inf there cannot reach the loss or gradient).
  """
  chex.assert_rank([logprobs, row_mask], [2, 1])
  chex.assert_equal_shape([logprobs, old_logprobs, advantages, loss_mask])
  chex.assert_equal_shape_prefix([logprobs, row_mask], 1)
  if opts.kl_coef > 0 and ref_logprobs is None:
    raise ValueError(f"ref_logprobs: required when kl_coef > 0 (kl_coef={opts.kl_coef})")
  if opts.entropy_coef > 0 and entropy is None:
    raise ValueError(f"entropy: required when entropy_coef > 0 (entropy_coef={opts.entropy_coef})")

  mask = loss_mask.astype(bool) & row_mask.astype(bool)[:, None]
  clean = lambda x: jnp.where(mask, jnp.asarray(x, jnp.float32), 0.0)
  logp, old, adv = clean(logprobs), clean(old_logprobs), clean(advantages)
  is_weights = None
  if opts.rollout_correction.enabled:  # TIS weights and MIS rows (rollout_correction)
    if sampler_logprobs is None:
      raise ValueError("sampler_logprobs: required when rollout_correction is on")
    chex.assert_equal_shape([logprobs, sampler_logprobs])
    corr = rollout_correction_lib.correction(old, sampler_logprobs, mask, opts.rollout_correction)
    mask, is_weights = mask & corr.keep[:, None], corr.weights  # MIS: out of every term

  if opts.ratio_level == "token":
    ratio = ratio_lib.token_ratio(logp, old)
  else:
    ratio = ratio_lib.gspo_token_ratio(logp, old, mask)
  if opts.surrogate == "cispo":
    pg = surrogate.cispo_surrogate(ratio, adv, logp, opts.clip_low, opts.clip_high)
  else:
    pg = surrogate.clipped_surrogate(ratio, adv, opts.clip_low, opts.clip_high)
  if opts.dual_clip is not None:
    pg = surrogate.dual_clip(pg, adv, opts.dual_clip)
  if is_weights is not None:
    pg = pg * is_weights
  agg = lambda x: aggregation_modes.aggregate(x, mask, opts.aggregation, opts.norm_constant)

  total = pg
  kl = ent = ent_tok = None
  if ref_logprobs is not None:
    chex.assert_equal_shape([logprobs, ref_logprobs])
    kl_tok = kl_lib.kl_penalty(logp, clean(ref_logprobs), opts.kl_estimator, opts.kl_clamp)
    kl = agg(kl_tok)
    if opts.kl_coef > 0:
      total = total + opts.kl_coef * kl_tok
  if entropy is not None:
    chex.assert_equal_shape([logprobs, entropy])
    ent_tok = clean(entropy)
    ent = agg(ent_tok)
    if opts.entropy_coef > 0:
      total = total - opts.entropy_coef * ent_tok

  metrics = loss_diagnostics(
      jax.lax.stop_gradient(ratio), jax.lax.stop_gradient(ratio_lib.clamped_log_ratio(logp, old)),
      adv, mask, opts.clip_low, opts.clip_high, opts.dual_clip,
      None if ent_tok is None else jax.lax.stop_gradient(ent_tok))
  return LossOutput(loss=agg(total), pg=agg(pg), kl=kl, entropy=ent, metrics=metrics)


def rollouts_loss(logprobs: jax.Array, rollouts: Rollouts, advantages: Advantages,
                  opts: LossOptions = LossOptions(), *,
                  entropy: Optional[jax.Array] = None,
                  sampler_logprobs: Optional[jax.Array] = None) -> LossOutput:
  """`policy_loss` with its inputs read from a `Rollouts` batch and an estimator's output."""
  return policy_loss(logprobs, rollouts.old_logprobs, advantages.tokens, rollouts.loss_mask,
                     advantages.row_mask, opts, ref_logprobs=rollouts.ref_logprobs,
                     entropy=entropy, sampler_logprobs=sampler_logprobs)
