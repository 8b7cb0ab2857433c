"""Masked segment statistics (spec §3) against numpy, per group."""

import functools

import jax
import numpy as np
import pytest
from hypothesis import given, strategies as st

from tirjax import segments

N, S = 24, 6  # elements, segments: one padded shape for every example

ALL_OPTIONS = [segments.ZScore(ddof=d, scale=s, singleton=g)
               for d in (0, 1) for s in ("std", "none") for g in ("zero", "raw")]


@functools.cache
def jitted(fn, *static):
  return jax.jit(lambda *a: fn(*a, *static))


@st.composite
def segmented(draw, grid: bool = False):
  """Values (with repeats, so all-equal groups occur), ids in [0, S), a mask.

  No subnormals: XLA on CPU flushes them to zero. `grid`: multiples of 1/64, which a shift by
  another multiple keeps exact.
  """
  value = (st.integers(-320, 320).map(lambda k: k / 64) if grid
           else st.floats(-5, 5, width=32, allow_subnormal=False))
  pool = draw(st.lists(value, min_size=1, max_size=4))
  x = np.array(draw(st.lists(st.sampled_from(pool) | value,
                             min_size=N, max_size=N)), np.float32)
  ids = np.array(draw(st.lists(st.integers(0, S - 1), min_size=N, max_size=N)), np.int32)
  mask = np.array(draw(st.lists(st.booleans(), min_size=N, max_size=N)))
  return x, ids, mask


def numpy_zscore(x, ids, mask, opts):
  out = np.zeros(N)
  for g in range(S):
    sel = mask & (ids == g)
    v = x[sel].astype(np.float64)
    if v.size == 0:
      continue
    if v.size == 1:
      out[sel] = v if opts.singleton == "raw" else 0.0
    elif v.max() - v.min() <= opts.eps * max(1.0, np.abs(v).max()):  # equal up to rounding
      out[sel] = 0.0
    elif opts.scale == "none":
      out[sel] = v - v.mean()
    else:
      out[sel] = (v - v.mean()) / (np.std(v, ddof=opts.ddof) + opts.eps)
  return out


@given(segmented(), st.sampled_from(ALL_OPTIONS))
def test_zscore_matches_numpy(data, opts):
  x, ids, mask = data
  z = np.asarray(jitted(segments.zscore, S, opts)(x, ids, mask))
  np.testing.assert_allclose(z, numpy_zscore(x, ids, mask, opts), atol=2e-5, rtol=1e-4)
  assert np.all(np.isfinite(z)) and not np.any(z[~mask])


@given(segmented(grid=True), st.integers(-640, 640))
def test_zscore_ignores_a_constant_shift(data, shift):
  x, ids, mask = data
  z = jitted(segments.zscore, S, segments.ZScore())
  np.testing.assert_allclose(z(x + np.float32(shift / 64), ids, mask), z(x, ids, mask),
                             atol=1e-4)


def test_zscore_values_equal_up_to_rounding_get_zero():
  # Mathematically 0.15 each; the float32 mean of three 0.15s is not the float32 0.15.
  means = np.array([np.float32(0.15) * 3 / 3, 0.15, (np.float32(0.05) + 0.25) / 2],
                   np.float32)
  z = jitted(segments.zscore, 1, segments.ZScore())(means, np.zeros(3, np.int32),
                                                     np.ones(3, bool))
  np.testing.assert_array_equal(z, 0.0)


@pytest.mark.parametrize("opts", ALL_OPTIONS)
def test_zscore_all_masked_is_zero(opts):
  z = jitted(segments.zscore, S, opts)(np.full(N, np.nan, np.float32) * 0 + 1,
                                       np.zeros(N, np.int32), np.zeros(N, bool))
  np.testing.assert_array_equal(z, 0.0)


@given(segmented())
def test_segment_reductions_match_numpy(data):
  x, ids, mask = data
  got = {name: np.asarray(jitted(getattr(segments, name), S)(x, ids, mask))
         for name in ("segment_sum", "segment_mean", "segment_max", "segment_min")}
  count = np.asarray(jitted(segments.segment_count, S)(ids, mask))
  for g in range(S):
    v = x[mask & (ids == g)].astype(np.float64)
    assert count[g] == v.size
    np.testing.assert_allclose(got["segment_sum"][g], v.sum(), atol=1e-4)
    np.testing.assert_allclose(got["segment_mean"][g], v.mean() if v.size else 0.0, atol=1e-5)
    np.testing.assert_allclose(got["segment_max"][g], v.max() if v.size else 0.0)
    np.testing.assert_allclose(got["segment_min"][g], v.min() if v.size else 0.0)


def test_gather_clips_ids():
  np.testing.assert_array_equal(segments.gather(np.array([1.0, 2.0]), np.array([-1, 0, 1, 5])),
                                [1.0, 1.0, 2.0, 2.0])
