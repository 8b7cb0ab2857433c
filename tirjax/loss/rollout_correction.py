"""Sampler–trainer mismatch corrections: truncated and masked importance sampling (TIS, MIS).

The sampler (vLLM or the JAX sampler) reports the log-prob of each token it drew,
log π_sampler(y_t) (`Rollouts.old_logprobs` as sampled). With a correction on, the trainer
recomputes log π_old(y_t) under the same weights with its own kernels before the first update
(`train_steps.reference.with_policy_logprobs`), and the policy loss corrects for the gap. Per
loss token (`mask = loss_mask ∧ row_mask`, n_b of them in row b):

    δ_t  = clamp(log π_old(y_t) − log π_sampler(y_t), −20, 20)          (0 off the mask)
    S_b  = Σ_{t ∈ y_b} δ_t         the log of row b's sequence ratio Π_t π_old(y_t)/π_sampler(y_t)

    TIS   token level     w_t = min(exp(δ_t), C)
          sequence level  w_t = min(exp(clamp(S_b, ±20)), C)    on every token t of row b
    MIS   row b stays in the loss iff  lo ≤ r_b ≤ hi, with
          r_b = exp(S_b)          (mask_level="sequence": the product of the token ratios)
          r_b = exp(S_b / n_b)    (mask_level="geometric": their geometric mean)

The loss then weighs each token's surrogate by w_t (`pg_t ← w_t · pg_t`; the KL and entropy
terms are not weighted) and drops the masked rows from its mask: every term and every
aggregation denominator (tokens or rows, `tirjax.loss.aggregation`) leaves them out. Both
w and the mask are constants of the gradient (`stop_gradient`): they change the measure the
samples are averaged under, not the objective. Truncating at C bounds the variance that
exp(S_b) would have and biases the estimate toward the sampler's policy where w > C; MIS
drops the rows whose ratio says their sampler's probability is far from the trainer's.

Conventions against verl's `rollout_corr_helper.py` (volcengine/verl, Jan 2026; decoupled
mode: π_old recomputed, weights from π_old / π_rollout):

* matched: the log-ratio's sign (trainer over sampler); the token weight exp(clamp(δ, ±20))
  truncated above only at C (`rollout_is_threshold`, default 2); the sequence weight the
  product of the token ratios (exp of the row's sum, clamped to ±20, not a geometric mean),
  broadcast to the row's tokens; weights detached and multiplying the per-token policy
  surrogate only; rejected rows removed from the loss mask, so they leave every
  aggregation's denominator (verl replaces `response_mask`); no batch normalisation of the
  weights (verl's `rollout_is_batch_normalize=False`, its default).
* mask_level="sequence" is verl's `rollout_rs="seq_sum_k1"` (its Seq-MIS preset with
  "0.5_2.0"), "geometric" its `seq_mean_k1` (Geo-RS), for bounds with lo = 1/hi. verl
  thresholds its k1 statistic −log r, so its "lo_hi" keeps rows with 1/r in [lo, hi]; here
  [lo, hi] bounds r itself. The two differ for asymmetric bounds only.
* differs: each token's log-ratio is clamped to ±20 before the row's sum, for the weight as
  for the mask (verl's rejection clamps so too; its sequence weight sums the unclamped ones,
  then clamps the sum): they differ only on a token more than 20 nats off, and here a
  sampler's −inf cannot make a row's sum −inf or NaN. C must be >= 1 (verl takes any C > 0).
* not offered: verl's token-level rejection (`token_k*`), its k2/k3 divergence filters and
  bypass mode (π_old := π_sampler: that is this trainer's default without a correction).
* where the advantages are computed: before the mask here, so a masked row still counts in its
  group's baseline; verl's GRPO also reads a rejected row's score for the group statistics
  (its advantage is then zeroed by the mask).

Agreement with verl's own functions, measured (not a test: verl is not a dependency), by
`python -m benchmarks.bench_rollout_correction --sections=verl` with verl's
`compute_rollout_correction_weights` and `compute_rollout_rejection_mask` exec'd from verl
b178a3cd (2026-01-29), on 300 random batches (29,631 tokens, 2,675 rows; gaps of 0.01 to 2
nats): token and sequence weights (C = 2) 0 mismatches (largest difference 1.2e-7 and
1.1e-6), the token share truncated equal to verl's `rollout_is_ratio_fraction_high` (2.6e-8),
rows kept 0 mismatches for the sequence product at [0.5, 2] and the geometric mean at
[0.9, 1/0.9]; at the asymmetric [0.6, 1.4], 194 rows differ, and 0 once verl is given the
inverted bounds "1/1.4_1/0.6" (`verl` in benchmarks/results/rollout_correction.json).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal, NamedTuple, get_args

import chex
import jax
import jax.numpy as jnp

from tirjax import option_checks

LOG_RATIO_CLAMP = 20.0
OFF = "off"
ISLevel = Literal["off", "token", "sequence"]
MaskLevel = Literal["off", "sequence", "geometric"]
IS_LEVELS = get_args(ISLevel)
MASK_LEVELS = get_args(MaskLevel)
GAP_QUANTILES = (0.5, 0.9, 0.99)


@dataclasses.dataclass(frozen=True)
class RolloutCorrectionOptions:
  """TIS and MIS of the policy loss (`LossOptions.rollout_correction`); off by default.

  Attributes:
    is_level: "off" (no weight), "token" (TIS per token) or "sequence" (the row's product).
    is_threshold: C >= 1, the truncation: w = min(ratio, C) (verl's default 2.0; verl takes
      any C > 0, but a C below 1 would reweigh the tokens of a sampler that agrees exactly).
    mask_level: "off" (no masking), "sequence" (bounds on the row's product of ratios) or
      "geometric" (bounds on their geometric mean, i.e. per token).
    mask_low, mask_high: [lo, hi] of MIS, 0 < lo <= 1 <= hi (verl's Seq-MIS: 0.5, 2.0), so
      that a row sampled with the trainer's own log-probs is always kept.
  """

  is_level: ISLevel = OFF
  is_threshold: float = 2.0
  mask_level: MaskLevel = OFF
  mask_low: float = 0.5
  mask_high: float = 2.0

  def __post_init__(self):
    option_checks.one_of("is_level", self.is_level, IS_LEVELS)
    option_checks.finite_at_least("is_threshold", self.is_threshold, 1.0)
    option_checks.one_of("mask_level", self.mask_level, MASK_LEVELS)
    option_checks.finite_above("mask_low", self.mask_low, 0)
    option_checks.at_most("mask_low", self.mask_low, 1.0)
    option_checks.finite_at_least("mask_high", self.mask_high, 1.0)

  @property
  def enabled(self) -> bool:
    """Whether the loss corrects at all (and so needs π_old recomputed and the sampler's
    log-probs)."""
    return self.is_level != OFF or self.mask_level != OFF


class Correction(NamedTuple):
  """What the loss applies, and what it is made of.

  Attributes:
    weights: [B, L] w_t on the mask (1 with `is_level="off"`), 0 off it; stop-gradiented.
    keep: [B] bool, rows MIS keeps (all True with `mask_level="off"`).
    log_ratio: [B, L] δ_t (0 off the mask).
    seq_log_ratio: [B] S_b.
    truncated: [B, L] bool, mask tokens whose untruncated weight exceeded C.
  """

  weights: jax.Array
  keep: jax.Array
  log_ratio: jax.Array
  seq_log_ratio: jax.Array
  truncated: jax.Array


def token_log_ratio(old_logprobs: jax.Array, sampler_logprobs: jax.Array, mask: jax.Array
                    ) -> jax.Array:
  """δ_t = clamp(log π_old − log π_sampler, ±20) on `mask`, 0 elsewhere (so NaN or ±inf off
  the mask never reach a sum). [B, L]."""
  chex.assert_equal_shape([old_logprobs, sampler_logprobs, mask])
  chex.assert_rank(mask, 2)
  diff = jnp.where(mask, old_logprobs.astype(jnp.float32) - sampler_logprobs.astype(jnp.float32),
                   0.0)
  return jnp.where(mask, jnp.clip(diff, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), 0.0)


def sequence_log_ratio(log_ratio: jax.Array, mask: jax.Array) -> jax.Array:
  """S_b = Σ_t δ_t over row b's mask tokens: log Π_t π_old(y_t)/π_sampler(y_t). [B]."""
  chex.assert_equal_shape([log_ratio, mask])
  return jnp.sum(jnp.where(mask, log_ratio, 0.0), axis=1)


def truncated_weights(log_ratio: jax.Array, threshold: float) -> tuple[jax.Array, jax.Array]:
  """(min(exp(clamp(x, ±20)), C), exp(x) > C) elementwise, for a log-ratio x (δ_t or S_b);
  the comparison is made in log space, so a ratio beyond exp(20) still counts as truncated."""
  x = jnp.clip(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
  over = log_ratio > math.log(threshold)
  return jnp.where(over, jnp.float32(threshold), jnp.exp(x)), over


def mask_rows(seq_log_ratio: jax.Array, num_tokens: jax.Array, level: str, low: float,
              high: float) -> jax.Array:
  """MIS: [B] bool, log lo <= r <= log hi with r = S_b ("sequence") or S_b / n_b
  ("geometric"); rows without tokens are kept (they carry no loss)."""
  chex.assert_equal_shape([seq_log_ratio, num_tokens])
  if level == "sequence":
    r = seq_log_ratio
  elif level == "geometric":
    r = seq_log_ratio / jnp.maximum(num_tokens, 1.0)
  else:
    raise ValueError(f"mask_level: must be one of {MASK_LEVELS[1:]}, got {level!r}")
  inside = (r >= math.log(low)) & (r <= math.log(high))
  return inside | (num_tokens == 0)


def correction(old_logprobs: jax.Array, sampler_logprobs: jax.Array, mask: jax.Array,
               opts: RolloutCorrectionOptions) -> Correction:
  """The TIS weights and MIS rows of a batch (see the module docstring).

  Args:
    old_logprobs: [B, L] log π_old, the trainer's.
    sampler_logprobs: [B, L] log π_sampler, as the sampler reported them.
    mask: [B, L] bool, the loss tokens (`loss_mask ∧ row_mask`).
    opts: which corrections, C and [lo, hi].
  """
  mask = mask.astype(bool)
  delta = token_log_ratio(old_logprobs, sampler_logprobs, mask)
  seq = sequence_log_ratio(delta, mask)
  n = jnp.sum(mask, axis=1, dtype=jnp.float32)
  if opts.is_level == "token":
    w, over = truncated_weights(delta, opts.is_threshold)
  elif opts.is_level == "sequence":
    w_row, over_row = truncated_weights(seq, opts.is_threshold)
    w, over = jnp.broadcast_to(w_row[:, None], mask.shape), over_row[:, None] & mask
  else:
    w, over = jnp.ones(mask.shape, jnp.float32), jnp.zeros(mask.shape, bool)
  keep = (jnp.ones(mask.shape[:1], bool) if opts.mask_level == OFF else
          mask_rows(seq, n, opts.mask_level, opts.mask_low, opts.mask_high))
  weights = jax.lax.stop_gradient(jnp.where(mask, w, 0.0))
  return Correction(weights=weights, keep=jax.lax.stop_gradient(keep), log_ratio=delta,
                    seq_log_ratio=seq, truncated=over & mask)


def masked_quantiles(x: jax.Array, mask: jax.Array, qs=GAP_QUANTILES) -> jax.Array:
  """Quantiles `qs` of `x` over `mask` (linear interpolation between order statistics, as
  `numpy.quantile`'s default); 0 where the mask is empty. [len(qs)]."""
  chex.assert_equal_shape([x, mask])
  flat, keep = x.reshape(-1).astype(jnp.float32), mask.reshape(-1).astype(bool)
  ordered = jnp.sort(jnp.where(keep, flat, jnp.inf))
  n = jnp.sum(keep)
  pos = jnp.asarray(qs, jnp.float32) * jnp.maximum(n - 1, 0).astype(jnp.float32)
  lo = jnp.floor(pos).astype(jnp.int32)
  hi = jnp.minimum(lo + 1, jnp.maximum(n - 1, 0))
  frac = pos - lo
  value = ordered[lo] * (1 - frac) + jnp.where(frac > 0, ordered[hi] * frac, 0.0)
  return jnp.where(n > 0, value, 0.0)


def metrics(old_logprobs: jax.Array, sampler_logprobs: jax.Array, mask: jax.Array,
            opts: RolloutCorrectionOptions) -> dict[str, jax.Array]:
  """A step's figures of the gap and of what the correction did, over the loss tokens
  `mask` (before MIS) of the whole batch (jit it on the global arrays: every process gets
  the batch's figures):

    gap_mean, gap_q50, gap_q90, gap_q99, gap_max   |δ_t| = |log π_old − log π_sampler|
    log_ratio_mean                                 mean δ_t (−k1 estimate of KL(π_s ‖ π_old))
    seq_log_ratio_min, seq_log_ratio_max           S_b over rows with loss tokens
    weight_mean, weight_min, weight_max            w_t after truncation
    truncated_token_share                          tokens whose weight was truncated at C
                                                   (sequence level: the truncated rows' tokens;
                                                   verl counts those rows)
    masked_row_share, masked_token_share           rows (and their tokens) MIS drops
  """
  mask = mask.astype(bool)
  c = correction(old_logprobs, sampler_logprobs, mask, opts)
  gap = jnp.abs(c.log_ratio)
  tokens = jnp.sum(mask, dtype=jnp.float32)
  per_row = jnp.sum(mask, axis=1)
  rows = per_row > 0
  num_rows = jnp.sum(rows, dtype=jnp.float32)
  mean = lambda x: jnp.sum(jnp.where(mask, x, 0.0)) / jnp.maximum(tokens, 1.0)
  lowest = lambda x, m: jnp.where(m.any(), jnp.min(jnp.where(m, x, jnp.inf)), 0.0)
  highest = lambda x, m: jnp.where(m.any(), jnp.max(jnp.where(m, x, -jnp.inf)), 0.0)
  masked = rows & ~c.keep
  q = masked_quantiles(gap, mask)
  out = {"gap_mean": mean(gap), "gap_max": highest(gap, mask),
         "log_ratio_mean": mean(c.log_ratio),
         "seq_log_ratio_min": lowest(c.seq_log_ratio, rows),
         "seq_log_ratio_max": highest(c.seq_log_ratio, rows),
         "weight_mean": mean(c.weights), "weight_min": lowest(c.weights, mask),
         "weight_max": highest(c.weights, mask),
         "truncated_token_share": jnp.sum(c.truncated) / jnp.maximum(tokens, 1.0),
         "masked_row_share": jnp.sum(masked) / jnp.maximum(num_rows, 1.0),
         "masked_token_share": jnp.sum(jnp.where(masked, per_row, 0)) / jnp.maximum(tokens, 1.0)}
  out.update({f"gap_q{round(100 * p)}": q[i] for i, p in enumerate(GAP_QUANTILES)})
  return out
