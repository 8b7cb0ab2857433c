"""Accumulable statistics: every loss term and diagnostic is a sum with its denominator.

A mean over a batch is kept as `Mean(sum, den)` rather than divided, so that statistics of
micro-batches (or of devices) combine exactly: `Σ sums / Σ dens` is the full-batch value.
`Summary` extends this to the spread of a masked quantity (mean, std, min, max). Both are
pytrees, so they pass through `jit`, `lax.scan` and `jax.tree.map`.
"""

from __future__ import annotations

from typing import Any, Union

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass(frozen=True)
class Mean:
  """`value = sum / den` (0 when `den == 0`); merge by adding both parts."""

  sum: jax.Array
  den: jax.Array

  @property
  def value(self) -> jax.Array:
    return jnp.where(self.den > 0, self.sum / jnp.where(self.den > 0, self.den, 1.0), 0.0)

  def merge(self, other: "Mean") -> "Mean":
    return Mean(self.sum + other.sum, self.den + other.den)


@flax.struct.dataclass(frozen=True)
class Summary:
  """Masked count, sum, sum of squares, min and max of a quantity; all 0 when empty.

  `std` is the population standard deviation `sqrt(E[x²] − E[x]²)` (clipped at 0); it loses
  precision when the spread is tiny relative to the mean (e.g. ratios all near 1).
  """

  count: jax.Array
  sum: jax.Array
  sum_sq: jax.Array
  min: jax.Array
  max: jax.Array

  @property
  def mean(self) -> jax.Array:
    return Mean(self.sum, self.count).value

  @property
  def std(self) -> jax.Array:
    var = Mean(self.sum_sq, self.count).value - self.mean ** 2
    return jnp.sqrt(jnp.maximum(var, 0.0))

  def merge(self, other: "Summary") -> "Summary":
    a, b = self.count > 0, other.count > 0
    lo = jnp.where(a & b, jnp.minimum(self.min, other.min), jnp.where(a, self.min, other.min))
    hi = jnp.where(a & b, jnp.maximum(self.max, other.max), jnp.where(a, self.max, other.max))
    return Summary(self.count + other.count, self.sum + other.sum, self.sum_sq + other.sum_sq,
                   lo, hi)


Stat = Union[Mean, Summary]


def masked_mean(x: jax.Array, mask: jax.Array) -> Mean:
  """`Mean(Σ mask·x, Σ mask)`: the token-level mean of `x` over `mask`."""
  x = jnp.where(mask, x, 0.0).astype(jnp.float32)
  return Mean(jnp.sum(x), jnp.sum(mask, dtype=jnp.float32))


def summarize(x: jax.Array, mask: jax.Array) -> Summary:
  """Count, sum, sum of squares, min and max of `x` over `mask` (all 0 if the mask is empty)."""
  x = jnp.where(mask, x, 0.0).astype(jnp.float32)
  count = jnp.sum(mask, dtype=jnp.float32)
  some = count > 0
  lo = jnp.where(some, jnp.min(jnp.where(mask, x, jnp.inf)), 0.0)
  hi = jnp.where(some, jnp.max(jnp.where(mask, x, -jnp.inf)), 0.0)
  return Summary(count, jnp.sum(x), jnp.sum(x * x), lo, hi)


def _is_stat(x) -> bool:
  return isinstance(x, (Mean, Summary))


def accumulate(a: Any, b: Any) -> Any:
  """Merges two pytrees of statistics of the same structure (e.g. two `LossOutput`s)."""
  return jax.tree.map(lambda x, y: x.merge(y), a, b, is_leaf=_is_stat)


def finalize(tree: Any) -> dict[str, jax.Array]:
  """Flat `{name: value}` of a pytree of statistics, for logging.

  A `Mean` at key path `k` gives `k`; a `Summary` gives `k/mean`, `k/std`, `k/min`, `k/max`
  and `k/count`. Key paths join dict keys and attribute names with `/`.
  """
  out: dict[str, jax.Array] = {}
  for path, stat in jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_stat)[0]:
    if not _is_stat(stat):
      raise TypeError(f"finalize: expected Mean or Summary leaves, got {type(stat).__name__} "
                      f"at {jax.tree_util.keystr(path)}")
    name = "/".join(_key_name(k) for k in path)
    if isinstance(stat, Mean):
      out[name] = stat.value
    else:
      out.update({f"{name}/mean": stat.mean, f"{name}/std": stat.std, f"{name}/min": stat.min,
                  f"{name}/max": stat.max, f"{name}/count": stat.count})
  return out


def _key_name(k) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)
