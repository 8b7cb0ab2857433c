"""Statistics over seeds: means with Student-t confidence intervals, paired comparisons.

Every function takes plain sequences of floats and returns plain floats (None where a value is
undefined: no data, or an interval from a single seed), so tables can show "n/a" rather than
a made-up number.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Optional, Sequence

import numpy as np
import scipy.stats


@dataclasses.dataclass(frozen=True)
class Interval:
  """Mean of n values with its two-sided confidence interval [low, high] (None if n < 2)."""

  n: int
  mean: Optional[float]
  low: Optional[float]
  high: Optional[float]

  @property
  def half_width(self) -> Optional[float]:
    return None if self.low is None else (self.high - self.low) / 2


def mean_ci(values: Sequence[float], level: float = 0.95) -> Interval:
  """mean ± t_{(1+level)/2, n−1} · s / √n, s the sample standard deviation (ddof = 1).

  The Student-t interval for the mean of n independent seeds.
  """
  if not 0 < level < 1:
    raise ValueError(f"level: must lie in (0, 1), got {level}")
  x = np.asarray([v for v in values], np.float64)
  if x.size and not np.all(np.isfinite(x)):
    raise ValueError(f"values: must be finite, got {x.tolist()}")
  if x.size == 0:
    return Interval(0, None, None, None)
  mean = float(x.mean())
  if x.size < 2:
    return Interval(1, mean, None, None)
  half = float(scipy.stats.t.ppf((1 + level) / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
  return Interval(int(x.size), mean, mean - half, mean + half)


@dataclasses.dataclass(frozen=True)
class Paired:
  """Paired comparison of a − b over matched seeds."""

  n: int
  diff: Interval  # mean difference and its confidence interval
  p_value: Optional[float]  # two-sided paired t-test; None if n < 2 or every difference is 0
  sd: Optional[float] = None  # standard deviation of the differences (ddof = 1; None if n < 2)


def paired(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> Paired:
  """Mean of d_i = a_i − b_i with its t-interval, and the paired t-test p-value of mean d = 0.

  `scipy.stats.ttest_rel(a, b)`, two-sided. A constant nonzero difference gives p = 0 (the
  statistic is infinite); all-zero differences leave it undefined (None), as with n < 2.
  """
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  if a.shape != b.shape or a.ndim != 1:
    raise ValueError(f"a, b: need two 1-D sequences of one length, got {a.shape} and {b.shape}")
  d = a - b
  p = None
  if d.size >= 2:
    with warnings.catch_warnings():  # near-constant differences: scipy warns, the value stands
      warnings.simplefilter("ignore", RuntimeWarning)
      p = float(scipy.stats.ttest_rel(a, b).pvalue)
    p = None if math.isnan(p) else p
  return Paired(int(d.size), mean_ci(d, level), p,
                float(d.std(ddof=1)) if d.size >= 2 else None)


def detectable_difference(sd: float, n: int, alpha: float = 0.05, power: float = 0.8
                          ) -> Optional[float]:
  """The smallest true mean difference a two-sided paired t-test over n seeds detects with
  probability `power` at level `alpha`, for differences of standard deviation `sd`:
  (t_{1−α/2, n−1} + t_{power, n−1}) · sd / √n (the usual normal-approximation formula with
  Student quantiles; None for n < 2)."""
  if n < 2 or sd is None:
    return None
  q = scipy.stats.t.ppf(1 - alpha / 2, n - 1) + scipy.stats.t.ppf(power, n - 1)
  return float(q * sd / math.sqrt(n))


def seeds_needed(sd: float, delta: float, alpha: float = 0.05, power: float = 0.8,
                 max_seeds: int = 10_000) -> Optional[int]:
  """The fewest seeds n ≥ 2 whose `detectable_difference(sd, n)` is at most `delta`."""
  if sd is None or delta <= 0:
    return None
  for n in range(2, max_seeds + 1):
    if detectable_difference(sd, n, alpha, power) <= delta:
      return n
  return None
