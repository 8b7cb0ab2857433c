"""The oracle: per-turn advantages from the environment's ground-truth turn labels (spec §4.4).

A positive control, not a method: it reads what no learner has, the right or wrong label of
every turn (`Rollouts.turn_label`, filled from the environment's `turn_labels`, spec §4.5), so
it places credit as well as credit can be placed. In an ablation it is the upper bound of what
per-turn credit assignment can buy: if even the oracle does not beat GRPO, the testbed cannot
show a credit effect, whatever the estimators under test do.
"""

from __future__ import annotations

import dataclasses

import chex
import jax.numpy as jnp

from tirjax.advantages.group import broadcast_steps
from tirjax.advantages.registry import Advantages, register
from tirjax.rollouts import Rollouts


@dataclasses.dataclass(frozen=True)
class OracleOptions:
  """No options: the formula has no free parameter (see `oracle`)."""


@register("oracle", OracleOptions, spec="4.4", needs=("turn_label",),
          reference="tirjax.testing.reference.oracle:oracle")
def oracle(r: Rollouts, opts: OracleOptions) -> Advantages:
  """Oracle credit: A_{j,t} = +1 for a right turn, −1 for a wrong one, on every token of it.

  A_{j,t} = ℓ_{j,t} ∈ {+1, −1} (`Rollouts.turn_label`), 0 on padding steps and on the steps
  of a row without labels (ℓ = 0); each generated token of step t takes A_{j,t} (spec §4).
  Worked example: a row whose turns are right, wrong, right (answer) gets steps (+1, −1, +1),
  whatever its R_out; a row of a failed episode whose first two calls were right and whose
  third was wrong gets (+1, +1, −1) where GRPO gives all three the same sign.

  Decisions, and why:

  * Labels, not outcomes: the sign of a turn is its label alone, never the row's R_out or the
    group's. Every wrong decision is blamed and every right one credited, in failed and in
    successful episodes, and in groups whose rows all fail or all succeed, where an outcome
    baseline (GRPO) gives nothing. So on labelled turns the credit measures of spec §4.5 are
    at their bounds: AUC 1 (and within queries, within all-fail queries), wrong → A < 0 1,
    collateral blame 0, free credit 0, no signal 0. That is what makes it an upper bound on
    credit *placement*. The answering turn is labelled by its verdict (spec §4.5), so the
    outcome still enters, as the last decision's label.
  * No baseline: a baseline exists to tell better-than-expected from worse-than-expected
    actions when only a return is known; a label already says which. Centring the labels (e.g.
    within the query's group, or per turn index) would zero the turns of a group whose turns
    are all right (or all wrong) and make a turn's sign depend on its neighbours', which is
    exactly the dependence the control must not have.
  * Unit magnitude, the scale of GRPO: GRPO's z-scores (ddof 1) over a group of n rows with
    mixed outcomes have mean square (n − 1)/n, so |A| ≈ 1 per token; ±1 puts the same scale
    on every token, so the learning rate, clip ε and loss aggregation of GRPO's configs
    transfer unchanged. The difference in total push is deliberate: GRPO gives the rows of
    all-equal groups 0, the oracle gives their turns ±1, so its update is larger by at most
    1 / (share of rows in mixed groups). That extra signal, in groups an outcome cannot
    split, is part of what per-turn credit can buy, so the control keeps it. A per-turn
    magnitude (e.g. |A_GRPO| of the row with the label's sign) would zero those groups again
    and measure placement within GRPO's budget only; it is not this control.
  * Unlabelled steps (ℓ = 0: a row whose task has no plan to label from) get 0, so they add
    nothing to the loss beyond its denominators, as padding steps do; a step of zero generated
    tokens keeps its A_{j,t} in `steps` and reaches no token.
  * Trees: rows that share a node share its label (`validate`), so every row through a shared
    step pushes it the same way; its net push is the label times the rows' weights.

  `rows` is the mean of the row's step advantages over its valid steps (share right − share
  wrong, 0 for a row without steps; logged, not used by the loss); `row_reward` is R_out;
  `row_mask` is `row_valid` (no filter).
  """
  del opts  # no options
  if r.turn_label is None:
    raise ValueError("oracle: the batch has no turn_label (Rollouts.turn_label, each turn's "
                     "ground-truth right/wrong label); only an environment that labels turns "
                     "(its registry entry's turn_labels, e.g. toolworld) gives it")
  chex.assert_equal_shape([r.turn_label, r.step_valid])  # [B, T]
  valid = r.step_valid & r.row_valid[:, None]
  steps = jnp.where(valid, jnp.sign(r.turn_label).astype(jnp.float32), 0.0)
  rows = jnp.sum(steps, axis=1) / jnp.maximum(jnp.sum(valid, axis=1), 1)
  out = broadcast_steps(r, steps, jnp.where(r.row_valid, rows, 0.0), r.outcome)
  chex.assert_type([out.steps, out.tokens, out.rows], jnp.float32)
  return out
