"""One record per loss-aggregation mode (issue 57): what each field says holds of the mode's
reduction, every user of a mode asks the record, and a mode without one is an error in each.
(The modes' values against hand figures and the loop reference: tests/test_loss_aggregation.py.)
"""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from configs import grpo
from tirjax.advantages import unlearning
from tirjax.credit.cells import parse_cell
from tirjax.credit.chain_rollouts import ChainRolloutOptions
from tirjax.loss import LossOptions, aggregation
from tirjax.testing import synthetic
from tirjax.testing.strategies import tree_batches
from tirjax.train_steps import SFTLossOptions
from tirjax.trainer.resolve import ConfigError, resolve


def _resolve_with(**loss):
  c = grpo.get_config("model=tiny")
  for key, value in loss.items():
    setattr(c.loss, key, value)
  return resolve(c)


def _unlearning_weights(mode):
  return unlearning.step_loss_weights(synthetic.tree_rollouts(np.random.default_rng(0), [3, 2]),
                                     mode)


# Each user of an aggregation mode, called with the mode named `mode` and a norm constant.
CONSUMERS = {
    "aggregate": lambda mode: aggregation.aggregate(jnp.ones((2, 3)), jnp.ones((2, 3), bool),
                                                    mode, 4.0),
    "loss options": lambda mode: LossOptions(aggregation=mode, norm_constant=4.0),
    "sft options": lambda mode: SFTLossOptions(aggregation=mode, norm_constant=4.0),
    "resolve": lambda mode: _resolve_with(aggregation=mode, norm_constant=4.0),
    "credit cell": lambda mode: parse_cell(f"grpo/loss.aggregation={mode}",
                                           ChainRolloutOptions(), 6),
    "unlearning": _unlearning_weights,
    "norm constant": lambda mode: aggregation.with_norm_constant({"aggregation": mode}, 6),
}


@pytest.mark.parametrize("consumer", sorted(CONSUMERS))
def test_a_mode_without_a_record_is_an_error_in_each_consumer(consumer):
  CONSUMERS[consumer]("seq_mean_token_sum")  # a mode with a record passes
  with pytest.raises(ValueError, match=r"aggregation: must be one of \('token_mean'.*"
                                       r"got 'token_median'"):
    CONSUMERS[consumer]("token_median")


def test_a_record_cannot_leave_a_rule_out():
  """A new mode states every rule: no field has a default, and `den` is one of two counts."""
  with pytest.raises(TypeError, match="mean_within_row"):
    aggregation.AggregationMode("token_median", lambda x, mask, c: None, den="rows",
                                needs_norm_constant=False)
  with pytest.raises(ValueError, match="den: must be one of"):
    aggregation.AggregationMode("token_median", lambda x, mask, c: None, mean_within_row=False,
                                den="queries", needs_norm_constant=False)
  assert aggregation.AGGREGATIONS == tuple(aggregation.MODES)
  assert all(name == mode.name for name, mode in aggregation.MODES.items())


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 5), st.integers(1, 6),
       st.sampled_from(aggregation.AGGREGATIONS))
def test_each_record_s_fields_describe_its_reduction(seed, rows, length, mode):
  """sum = Σ_b f_b Σ_t x / (C where the mode needs it), f_b = 1/n_b (rows with n_b > 0) where
  it averages within a row, else 1; den = Σ_b n_b ("tokens") or R ("rows"). Ragged masks, rows
  without tokens and all-masked batches included."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(rows, length)).astype(np.float32)
  mask = rng.random((rows, length)) < rng.choice([0.0, 0.5, 1.0])
  rule, c = aggregation.MODES[mode], 3.0
  out = rule.reduce(jnp.asarray(x), jnp.asarray(mask), c)
  n = mask.sum(1)
  row_sum = np.where(mask, x.astype(np.float64), 0.0).sum(1)
  f = np.where(n > 0, 1.0 / np.maximum(n, 1), 0.0) if rule.mean_within_row else np.ones(rows)
  want_sum = (f * row_sum).sum() / (c if rule.needs_norm_constant else 1.0)
  want_den = n.sum() if rule.den == "tokens" else (n > 0).sum()
  assert float(out.sum) == pytest.approx(want_sum, rel=1e-5, abs=1e-5)
  assert float(out.den) == want_den


@pytest.mark.parametrize("mode", aggregation.AGGREGATIONS)
def test_the_norm_constant_rule_is_the_record_s(mode):
  """Where a mode needs a constant, every consumer refuses none (and one ≤ 0), and the credit
  bench fills in the longest row; where it needs none, none is asked and none is filled in."""
  rule = aggregation.MODES[mode]
  assert rule.default_norm_constant(7) == (7.0 if rule.needs_norm_constant else None)
  given = aggregation.with_norm_constant({"aggregation": mode, "clip_high": 0.28}, 7)
  assert given == ({"norm_constant": 7.0} if rule.needs_norm_constant else {}) | {
      "aggregation": mode, "clip_high": 0.28}
  assert aggregation.with_norm_constant({"aggregation": mode, "norm_constant": 2.0}, 7) == {
      "aggregation": mode, "norm_constant": 2.0}
  assert aggregation.with_norm_constant({"clip_high": 0.28}, 7) == {"clip_high": 0.28}
  cell = parse_cell(f"grpo/loss.aggregation={mode}", ChainRolloutOptions(), 7)
  assert cell.loss.norm_constant == rule.default_norm_constant(7)
  x, mask = jnp.ones((2, 3)), jnp.ones((2, 3), bool)
  for missing in (None, 0.0, -1.0):
    build = [lambda: aggregation.aggregate(x, mask, mode, missing)]
    if missing is None:  # a value ≤ 0 is the options' own range check, whatever the mode
      build += [lambda: LossOptions(aggregation=mode, norm_constant=missing),
                lambda: SFTLossOptions(aggregation=mode, norm_constant=missing),
                lambda: _resolve_with(aggregation=mode, norm_constant=missing)]
    for make in build:
      if rule.needs_norm_constant:
        with pytest.raises(ValueError, match="norm_constant"):
          make()
      else:
        make()


def test_resolve_names_the_key_of_a_missing_constant():
  with pytest.raises(ConfigError, match="loss: norm_constant: required by aggregation="
                                        "'seq_mean_token_sum_norm'"):
    _resolve_with(aggregation="seq_mean_token_sum_norm", norm_constant=None)


@settings(max_examples=25, deadline=None)
@given(tree_batches(), st.sampled_from(aggregation.AGGREGATIONS))
def test_the_unlearning_weight_is_the_record_s(r, mode):
  """A throwaway mode that copies another's record gets that mode's unlearning weights: the
  diagnostic reads the record's `mean_within_row`, not the mode's name."""
  copy = dataclasses.replace(aggregation.MODES[mode], name="copy")
  modes = dict(aggregation.MODES, copy=copy)
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(aggregation, "MODES", modes)
    got = unlearning.step_loss_weights(r, "copy")
  np.testing.assert_array_equal(np.asarray(got),
                                np.asarray(unlearning.step_loss_weights(r, mode)))
