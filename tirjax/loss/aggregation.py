"""Loss aggregation over tokens and rows, as `(sum, denominator)` pairs (spec §5): one record
per mode (`AggregationMode`, in `MODES`), which every user of a mode asks.

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

Who asks the record: the policy loss and its options (`tirjax.loss.objective`), the SFT loss
(`tirjax.train_steps.sft`), the trainer's config checks (through `LossOptions`), the credit
bench's cells (`with_norm_constant`) and the unlearning diagnostic
(`tirjax.advantages.unlearning`: each row's weight on its tokens). A mode is one entry of
`MODES` with every field given; a name that is not there is an error in each of them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional

import chex
import jax
import jax.numpy as jnp

from tirjax import option_checks
from tirjax.loss.stats import Mean


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


DENOMINATORS = ("tokens", "rows")


@dataclasses.dataclass(frozen=True)
class AggregationMode:
  """One aggregation mode: everything the loss, SFT, the config checks, the credit bench and
  the unlearning diagnostic ask of it. Every field is required: a mode cannot be added without
  saying how each of them treats it.

  Attributes:
    name: the mode's name (`LossOptions.aggregation`, `SFTLossOptions.aggregation`).
    reduce: `(x, mask, norm_constant) -> Mean(sum, den)`, the mode itself (a mode that needs
      no constant ignores it).
    mean_within_row: each row's token terms are averaged (weighed 1/n_b) before rows are
      added; otherwise every token of a row weighs the same. It is the unlearning diagnostic's
      row weight on a step's tokens (`tirjax.advantages.unlearning.step_loss_weights`):
      f_b = 1/n_b, or 1 (the modes' other divisors are common to all rows).
    den: what the denominator counts: "tokens" (Σ_b n_b) or "rows" (R).
    needs_norm_constant: the sum is divided by a fixed constant C > 0 (`norm_constant`),
      which the options must give; where a run does not set it, it is the longest row in
      loss tokens (`default_norm_constant`: Dr. GRPO's max generation length).
  """

  name: str
  reduce: Callable[[jax.Array, jax.Array, Optional[float]], Mean]
  mean_within_row: bool
  den: str
  needs_norm_constant: bool

  def __post_init__(self):
    option_checks.one_of("den", self.den, DENOMINATORS)

  def check_norm_constant(self, norm_constant: Optional[float]) -> None:
    """Raises ValueError("norm_constant: ...") where this mode needs a constant and
    `norm_constant` is not one > 0."""
    if self.needs_norm_constant and (norm_constant is None or not norm_constant > 0):
      raise ValueError(f"norm_constant: required by aggregation={self.name!r}, a constant > 0 "
                       f"(e.g. the max generation length), got {norm_constant!r}")

  def default_norm_constant(self, longest_row: int) -> Optional[float]:
    """The constant this mode divides by where none is given: the longest row in loss
    tokens (`longest_row`) for a mode that needs one, None for the others."""
    return float(longest_row) if self.needs_norm_constant else None


MODES: Mapping[str, AggregationMode] = {m.name: m for m in (
    AggregationMode("token_mean", lambda x, mask, c: token_mean(x, mask),
                    mean_within_row=False, den="tokens", needs_norm_constant=False),
    AggregationMode("seq_mean_token_mean", lambda x, mask, c: seq_mean_token_mean(x, mask),
                    mean_within_row=True, den="rows", needs_norm_constant=False),
    AggregationMode("seq_mean_token_sum_norm", seq_mean_token_sum_norm,
                    mean_within_row=False, den="rows", needs_norm_constant=True),
    AggregationMode("seq_mean_token_sum", lambda x, mask, c: seq_mean_token_sum(x, mask),
                    mean_within_row=False, den="rows", needs_norm_constant=False),
)}

AGGREGATIONS = tuple(MODES)


def lookup(mode: str) -> AggregationMode:
  """The record of the mode named `mode`.

  Raises:
    ValueError("aggregation: must be one of (...), got ...") for a name without a record.
  """
  option_checks.one_of("aggregation", mode, tuple(MODES))
  return MODES[mode]


def check_options(mode: str, norm_constant: Optional[float]) -> None:
  """What an options dataclass with the two fields `aggregation` and `norm_constant`
  (`LossOptions`, `SFTLossOptions`) checks of them: a mode with a record, and the constant it
  needs (an unused constant may be given; it must still be finite and > 0)."""
  rule = lookup(mode)
  option_checks.finite_above("norm_constant", norm_constant, 0, none_ok=True)
  rule.check_norm_constant(norm_constant)


def with_norm_constant(options: dict[str, Any], longest_row: int) -> dict[str, Any]:
  """`options` (`LossOptions` fields) with the norm constant that an `aggregation` among them
  needs, where they give none: `default_norm_constant(longest_row)`. Options without an
  `aggregation` are returned as they are.

  Raises:
    ValueError: an `aggregation` without a record.
  """
  if "aggregation" not in options:
    return dict(options)
  constant = lookup(options["aggregation"]).default_norm_constant(longest_row)
  return {"norm_constant": constant, **options} if constant is not None else dict(options)


def aggregate(x: jax.Array, mask: jax.Array, mode: str,
              norm_constant: Optional[float] = None) -> Mean:
  """`x` reduced by the mode named `mode` (see the module docstring)."""
  rule = lookup(mode)
  rule.check_norm_constant(norm_constant)
  return rule.reduce(x, mask, norm_constant)
