"""Loss aggregation over tokens and rows, as `(sum, denominator)` pairs (spec §5).

Each mode reduces a per-token loss `x [B, L]` over `mask [B, L]` (generated tokens of the rows
that enter the loss) to a `Mean(sum, den)` whose value `sum / den` is the mode's loss. The
denominator never depends on parameters, and the per-row normaliser of the `seq_mean_*` modes
is applied inside the sum, so for any split of the rows into micro-batches (or devices)
`Σ sums / Σ dens` equals the full-batch value exactly, in value and in gradient.

With `n_b = Σ_t mask[b, t]` and `R = #{b : n_b > 0}` (rows that carry at least one token):

| mode                      | sum                              | den       |
| ---                       | ---                              | ---       |
| `token_mean`              | Σ_b Σ_t x                        | Σ_b n_b   |
| `seq_mean_token_mean`     | Σ_{b: n_b>0} (Σ_t x) / n_b       | R         |
| `seq_mean_token_sum_norm` | Σ_b (Σ_t x) / norm_constant      | R         |
| `seq_mean_token_sum`      | Σ_b Σ_t x                        | R         |
"""

from __future__ import annotations

from typing import Optional

import chex
import jax
import jax.numpy as jnp

from tirjax.loss.stats import Mean

AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm",
                "seq_mean_token_sum")


def _row_sums(x: jax.Array, mask: jax.Array):
  chex.assert_equal_shape([x, mask])
  chex.assert_rank(x, 2)
  row_sum = jnp.sum(jnp.where(mask, x, 0.0), axis=1, dtype=jnp.float32)
  n = jnp.sum(mask, axis=1, dtype=jnp.float32)
  return row_sum, n


def _rows(n: jax.Array) -> jax.Array:
  return jnp.sum(n > 0, dtype=jnp.float32)


def token_mean(x: jax.Array, mask: jax.Array) -> Mean:
  """`(1 / Σ_b |y_b|) Σ_b Σ_t x_{b,t}`: every token weighs the same.

  DAPO's token-level loss (Yu et al. 2025, Eq. 12).
  """
  row_sum, n = _row_sums(x, mask)
  return Mean(jnp.sum(row_sum), jnp.sum(n))


def seq_mean_token_mean(x: jax.Array, mask: jax.Array) -> Mean:
  """`(1/R) Σ_b (1/|y_b|) Σ_t x_{b,t}`: every row weighs the same.

  GRPO (Shao et al. 2024, Eq. 3) and PORTool's `1/n Σ_j 1/|τ_j| Σ_t`.
  """
  row_sum, n = _row_sums(x, mask)
  return Mean(jnp.sum(jnp.where(n > 0, row_sum / jnp.maximum(n, 1.0), 0.0)), _rows(n))


def seq_mean_token_sum_norm(x: jax.Array, mask: jax.Array, norm_constant: float) -> Mean:
  """`(1/R) Σ_b (1/C) Σ_t x_{b,t}` with a fixed constant C (e.g. the max generation length).

  Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", Eq. 3 and its
  reference code): no per-row length normalisation, so long and short rows are not biased.
  """
  row_sum, n = _row_sums(x, mask)
  return Mean(jnp.sum(row_sum) / norm_constant, _rows(n))


def seq_mean_token_sum(x: jax.Array, mask: jax.Array) -> Mean:
  """`(1/R) Σ_b Σ_t x_{b,t}`: the mean over rows of each row's summed loss."""
  row_sum, n = _row_sums(x, mask)
  return Mean(jnp.sum(row_sum), _rows(n))


def aggregate(x: jax.Array, mask: jax.Array, mode: str,
              norm_constant: Optional[float] = None) -> Mean:
  """Dispatches to the aggregation named `mode` (see the module docstring)."""
  if mode == "token_mean":
    return token_mean(x, mask)
  if mode == "seq_mean_token_mean":
    return seq_mean_token_mean(x, mask)
  if mode == "seq_mean_token_sum":
    return seq_mean_token_sum(x, mask)
  if mode == "seq_mean_token_sum_norm":
    if norm_constant is None or not norm_constant > 0:
      raise ValueError("norm_constant: seq_mean_token_sum_norm needs a constant > 0, got "
                       f"{norm_constant!r}")
    return seq_mean_token_sum_norm(x, mask, norm_constant)
  raise ValueError(f"aggregation: must be one of {AGGREGATIONS}, got {mode!r}")
