"""Masked segment statistics: the group and tree arithmetic of every estimator (spec §3).

Groups are ragged and trees irregular, so statistics are taken with segment operations over
ids (`group_id`, `node_id`, or any derived key) with a validity mask, never by reshaping to
`[Q, G]`. Segment counts are static (`num_segments`), so these functions jit once per shape.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import chex
import jax
import jax.numpy as jnp

from tirjax import option_checks


@dataclasses.dataclass(frozen=True)
class ZScore:
  """Group-normalisation conventions shared by all estimators (spec §3).

  z = (x - mean) / (std + eps), with `std` taken with `ddof` (1 as verl, MatchTIR and Tunix);
  `scale="none"` keeps x - mean (Dr. GRPO). A group with one valid member gets 0
  (`singleton="zero"`) or its raw value (`"raw"`, as verl); a group whose values are all
  equal gets exactly 0.
  """

  ddof: Literal[0, 1] = 1  # delta degrees of freedom of the group's std
  scale: Literal["std", "none"] = "std"  # divide by std + eps, or keep x - mean (Dr. GRPO)
  singleton: Literal["zero", "raw"] = "zero"  # a group with one valid member: 0 or its raw value
  eps: float = 1e-6  # added to the std before dividing

  def __post_init__(self):
    option_checks.typed_choices(self)
    option_checks.above("eps", self.eps, 0)


def _ids(ids: jax.Array, mask: jax.Array, num_segments: int) -> jax.Array:
  # Masked entries go to an extra trash segment so they never touch a real one.
  return jnp.where(mask, ids, num_segments)


def segment_sum(x, ids, mask, num_segments: int) -> jax.Array:
  """Sum of `x` over each segment, masked entries excluded. Returns [num_segments]."""
  chex.assert_equal_shape([x, ids, mask])
  x = jnp.where(mask, x, 0)
  return jax.ops.segment_sum(x.ravel(), _ids(ids, mask, num_segments).ravel(),
                             num_segments + 1)[:num_segments]


def segment_count(ids, mask, num_segments: int) -> jax.Array:
  return segment_sum(mask.astype(jnp.float32), ids, mask, num_segments)


def segment_mean(x, ids, mask, num_segments: int) -> jax.Array:
  """Mean over each segment; 0 for an empty segment."""
  count = segment_count(ids, mask, num_segments)
  return segment_sum(x, ids, mask, num_segments) / jnp.maximum(count, 1.0)


def segment_max(x, ids, mask, num_segments: int, empty: float = 0.0) -> jax.Array:
  chex.assert_equal_shape([x, ids, mask])
  out = jax.ops.segment_max(jnp.where(mask, x, -jnp.inf).ravel(),
                            _ids(ids, mask, num_segments).ravel(), num_segments + 1)
  out = out[:num_segments]
  return jnp.where(jnp.isfinite(out), out, empty)


def segment_min(x, ids, mask, num_segments: int, empty: float = 0.0) -> jax.Array:
  return -segment_max(-x, ids, mask, num_segments, -empty)


def gather(seg_values: jax.Array, ids: jax.Array) -> jax.Array:
  """Reads a per-segment value back at each element (ids clipped: callers mask)."""
  return seg_values[jnp.clip(ids, 0, seg_values.shape[0] - 1)]


def zscore(x, ids, mask, num_segments: int, opts: ZScore = ZScore()) -> jax.Array:
  """Group z-score of `x` within segments (spec §3). 0 on masked entries.

  Never NaN or Inf: counts are floored at 1 and `std + eps > 0`. A group counts as all-equal
  when its spread max − min is at most `eps · max(1, |x|)`: values that are equal up to
  float32 rounding (say, means of the same rewards summed in another order) get exactly 0,
  not ±rounding/eps (up to ~0.3 at eps = 1e-6).
  """
  x = jnp.asarray(x, jnp.float32)
  count = segment_count(ids, mask, num_segments)
  dev = x - gather(segment_mean(x, ids, mask, num_segments), ids)
  if opts.scale == "std":
    z = dev / (gather(segment_std(x, ids, mask, num_segments, opts.ddof), ids) + opts.eps)
  else:
    z = dev
  return degenerate_groups(z, x, ids, mask, num_segments, opts, count)


def segment_std(x, ids, mask, num_segments: int, ddof: int = 1) -> jax.Array:
  """Standard deviation over each segment with `ddof` (count − ddof floored at 1)."""
  count = segment_count(ids, mask, num_segments)
  dev = x - gather(segment_mean(x, ids, mask, num_segments), ids)
  var = segment_sum(dev * dev, ids, mask, num_segments) / jnp.maximum(count - ddof, 1.0)
  return jnp.sqrt(var)


def degenerate_groups(z, x, ids, mask, num_segments: int, opts: ZScore = ZScore(),
                      count=None) -> jax.Array:
  """spec §3's degenerate groups on a group-relative statistic `z` of the values `x`.

  A group whose values are all equal (spread max − min at most `eps · max(1, |x|)`) gets
  exactly 0; a group with one member gets 0, or its raw value `x` with `singleton="raw"`;
  masked entries get 0. Every baseline estimator (z-score, mean or weighted-mean deviation)
  ends with this, so that the conventions are the same whatever the baseline.
  """
  chex.assert_equal_shape([z, x, ids, mask])
  x = jnp.asarray(x, jnp.float32)
  count = segment_count(ids, mask, num_segments) if count is None else count
  hi, lo = segment_max(x, ids, mask, num_segments), segment_min(x, ids, mask, num_segments)
  equal = hi - lo <= opts.eps * jnp.maximum(1.0, jnp.maximum(jnp.abs(hi), jnp.abs(lo)))
  n = gather(count, ids)
  z = jnp.where(gather(equal, ids), 0.0, z)
  z = jnp.where(n == 1, x if opts.singleton == "raw" else 0.0, z)
  return jnp.where(mask, z, 0.0)


def whiten(x, mask, opts: ZScore = ZScore()) -> jax.Array:
  """z-score of `x` over all of its entries where `mask` holds, as one group (a batch-level
  whitening, e.g. over every loss token of a batch); 0 where `mask` is False."""
  chex.assert_equal_shape([x, mask])
  return zscore(x, jnp.zeros(jnp.shape(x), jnp.int32), mask, 1, opts)
