"""The oracle positive control (spec §4.4): per-turn advantages from ground-truth turn labels,
against its loop reference, on degenerate inputs, its refusals, and how the labels reach it.

Fault injected (recorded here, as docs/adding_an_estimator.md asks): flipping the label's sign
in the kernel (`jnp.sign(-r.turn_label)` in `tirjax/advantages/oracle.py`) fails 3 of this
file's 10 tests: `test_reference_row_permutation_and_padding` against the loop reference
(steps[0, 0] −1 where the reference has +1), `test_worked_group_is_independent_of_outcomes`
and `test_label_strings_become_the_field_as_the_trainer_fills_it` (checked, then undone).
"""

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, strategies as st

from tirjax import advantages
from tirjax.advantages.oracle import OracleOptions
from tirjax.credit import chain_rollouts
from tirjax.metrics import credit as fid
from tirjax.credit.task import ChainTask
from tirjax.env.toolworld.failures import RIGHT
from tirjax.rollouts import RolloutsError, from_numpy, to_numpy
from tirjax.testing.estimator_checks import (check_padding, check_reference,
                                             check_row_permutation, with_needed_fields)
from tirjax.testing.records import GroupRecord, RowRecord, StepRecord, build_rollouts
from tirjax.testing.strategies import tree_batches

ORACLE = advantages.get("oracle")
ADD = {"name": "add", "arguments": {"a": 1}}
ANSWER = {"name": "response_gen", "arguments": {"answer": "3"}}


def without_tokens(r, rng: np.random.Generator, p: float = 0.3):
  """`r` with the generated tokens of a random share `p` of its steps taken out of the loss:
  zero-length turns (a step that generated nothing the loss sees)."""
  a = to_numpy(r)
  B, T = a["step_valid"].shape
  empty = rng.random((B, T)) < p
  rows = np.arange(B)[:, None]
  drop = a["loss_mask"] & empty[rows, np.clip(a["token_step"], 0, T - 1)]
  a["loss_mask"] = a["loss_mask"] & ~drop
  a["token_step"] = np.where(drop, -1, a["token_step"])
  return from_numpy(a)


@given(tree_batches(), st.integers(0, 2**32 - 1), st.booleans())
def test_reference_row_permutation_and_padding(r, seed, empty_turns):
  """Against the loop reference on random ragged trees (all-right and all-wrong groups, padding
  rows, rows without steps, zero-length turns); rows reordered, outputs reordered; padding
  rows, steps and tokens change nothing; finite everywhere; shapes and dtypes."""
  if empty_turns:
    r = without_tokens(r, np.random.default_rng(seed))
  variants = [("oracle", OracleOptions())]
  check_reference(r, variants, keys=("steps", "tokens"), atol=0, rtol=0)  # exactly ±1 or 0
  check_reference(r, variants, keys=("rows",), atol=1e-6, rtol=0)  # a float32 mean
  check_row_permutation(r, seed, ["oracle"])
  check_padding(r, seed, ["oracle"])
  out = ORACLE(r)
  B, T, L = r.num_rows, r.max_steps, r.max_tokens
  chex.assert_shape([out.steps], (B, T))
  chex.assert_shape([out.tokens], (B, L))
  chex.assert_shape([out.rows, out.row_reward, out.row_mask], (B,))
  chex.assert_type([out.steps, out.tokens, out.rows, out.row_reward], jnp.float32)
  chex.assert_type(out.row_mask, bool)
  chex.assert_tree_all_finite((out.steps, out.tokens, out.rows, out.row_reward))
  steps, sv = np.asarray(out.steps), np.asarray(r.step_valid)
  np.testing.assert_array_equal(np.abs(steps[sv]), 1.0)  # every labelled step: ±1
  assert not steps[~sv].any() and not np.asarray(out.tokens)[~np.asarray(r.loss_mask)].any()
  np.testing.assert_array_equal(out.row_mask, r.row_valid)


def test_worked_group_is_independent_of_outcomes():
  """One query, three rows: a success with a wrong detour, a failure whose two calls were right
  and whose answer was wrong, and a failure of one wrong step; then a group whose rows all
  fail (GRPO: 0 everywhere) and a group whose rows all succeed. Each step's advantage is its
  label, whatever R_out; a row's is the mean of its steps'."""
  def row(outcome, *rights):
    steps = [StepRecord(calls=[ADD], right=x, tokens=(4, 5)) for x in rights[:-1]]
    steps.append(StepRecord(calls=[ANSWER], right=rights[-1], tokens=(6,)))
    return RowRecord(outcome=outcome, steps=steps)
  groups = [GroupRecord(gt_calls=[ADD], rows=[row(1, True, False, True), row(-1, True, True,
                                                                              False),
                                              RowRecord(outcome=-1, steps=[
                                                  StepRecord(calls=[ADD], right=False)])]),
            GroupRecord(gt_calls=[ADD], rows=[row(-1, True, False), row(-1, False, False)]),
            GroupRecord(gt_calls=[ADD], rows=[row(1, True, True), row(1, False, True)])]
  r = build_rollouts(groups, with_labels=True, num_rows=9, max_steps=4)
  out = ORACLE(r)
  want = np.array([[1, -1, 1, 0], [1, 1, -1, 0], [-1, 0, 0, 0], [1, -1, 0, 0], [-1, -1, 0, 0],
                   [1, 1, 0, 0], [-1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]], np.float32)
  np.testing.assert_array_equal(out.steps, want)
  np.testing.assert_allclose(out.rows, [1 / 3, 1 / 3, -1, 0, -1, 1, 0, 0, 0])
  np.testing.assert_array_equal(out.row_reward, [1, -1, -1, -1, -1, 1, 1, 0, 0])
  assert not np.asarray(advantages.get("grpo")(r).steps)[3:7].any()  # GRPO: nothing there
  tokens, ts = np.asarray(out.tokens), np.asarray(r.token_step)
  lm = np.asarray(r.loss_mask)
  np.testing.assert_array_equal(tokens[lm], want[np.nonzero(lm)[0], ts[lm]])


def test_degenerate_batches_are_finite_and_zero_where_nothing_is_labelled():
  """All padding, rows without steps, a labelled batch whose rows' labels are all absent
  (`turn_label` 0: rows whose task has no plan): 0 everywhere, never NaN."""
  r = build_rollouts([], with_labels=True, num_rows=4, max_steps=2, max_tokens=4)
  assert not np.asarray(ORACLE(r).tokens).any() and not np.asarray(ORACLE(r).rows).any()
  r = build_rollouts([GroupRecord(rows=[RowRecord(outcome=-1, steps=[])] * 3)],
                     with_labels=True, num_rows=4, max_steps=2)
  out = ORACLE(r)
  assert not np.asarray(out.steps).any() and not np.asarray(out.rows).any()
  r = build_rollouts([GroupRecord(rows=[RowRecord(outcome=1, steps=[StepRecord()] * 2)])],
                     with_labels=True)
  out = ORACLE(r.replace(turn_label=jnp.zeros_like(r.turn_label)))
  assert not np.asarray(out.tokens).any() and np.all(np.isfinite(np.asarray(out.rows)))


def test_a_batch_without_labels_is_refused_naming_the_field():
  r = build_rollouts([GroupRecord(rows=[RowRecord(outcome=1, steps=[StepRecord()])])])
  with pytest.raises(ValueError, match="oracle: the batch has no turn_label"):
    ORACLE(r)
  assert "turn_label" in ORACLE.needs
  assert with_needed_fields(ORACLE, r).turn_label is not None  # the checks' stand-in


def test_a_config_on_an_environment_without_turn_labels_fails_before_compute(tmp_path):
  """configs/oracle.py on `doors` (an environment without turn labels): the trainer refuses it
  before anything runs or is written, naming the key, the estimator and the environment."""
  from configs import oracle  # noqa: PLC0415
  from tirjax.trainer import resolve  # noqa: PLC0415
  from tirjax.trainer.train import run  # noqa: PLC0415
  assert resolve.resolve(oracle.get_config("model=tiny")).estimator.name == "oracle"
  workdir = tmp_path / "run"
  with pytest.raises(resolve.ConfigError,
                     match=r"advantage\.name: advantage oracle reads each turn's ground-truth "
                           r"label .*env\.name='doors'.* environments that label turns: "
                           r"toolworld"):
    run(oracle.get_config("model=tiny,env=doors"), str(workdir))
  assert not workdir.exists()


@pytest.mark.parametrize("change, match", [
    (lambda a: a["turn_label"].__setitem__((0, 0), 2), "values must be"),
    (lambda a: a["turn_label"].__setitem__((0, 3), 1), "must be 0 on padding steps"),
    (lambda a: a["turn_label"].__setitem__((1, 0), -a["turn_label"][0, 0]),
     "rows that share a node share its step"),
])
def test_validate_names_turn_label(change, match):
  """Labels in {+1, -1, 0}, 0 on padding steps, one per tree node."""
  r = build_rollouts([GroupRecord(rows=[
      RowRecord(outcome=1, steps=[StepRecord(node="a"), StepRecord(node="b")]),
      RowRecord(outcome=-1, steps=[StepRecord(node="a"), StepRecord(node="c", right=False)])])],
      with_labels=True, max_steps=4)
  a = {k: np.array(v) for k, v in to_numpy(r).items()}  # writable copies
  change(a)
  with pytest.raises(RolloutsError, match=f"turn_label: .*{match}"):
    from_numpy(a)


def test_label_strings_become_the_field_as_the_trainer_fills_it():
  """`fidelity.with_turn_labels`, what `stages.sample` and the credit-fidelity study call: RIGHT
  is +1, every wrong kind −1, a row without labels 0; a count that is not the row's steps
  fails; the oracle's turns are then at every bound of spec §4.5."""
  r = build_rollouts([GroupRecord(rows=[
      RowRecord(outcome=-1, steps=[StepRecord(), StepRecord(), StepRecord()]),
      RowRecord(outcome=1, steps=[StepRecord(), StepRecord()]),
      RowRecord(outcome=-1, steps=[StepRecord()])])], num_rows=4)
  labels = [[RIGHT, "direction", "answer"], [RIGHT, RIGHT], None, None]
  got = fid.with_turn_labels(r, labels)
  np.testing.assert_array_equal(got.turn_label, [[1, -1, -1], [1, 1, 0], [0, 0, 0], [0, 0, 0]])
  with pytest.raises(ValueError, match="row 1 has 3 turn labels for 2 steps"):
    fid.with_turn_labels(r, [labels[0], [RIGHT] * 3, None, None])
  measures = fid.fidelity(fid.turn_table(got, np.asarray(ORACLE(got).tokens), labels))
  assert measures["auc"] == measures["auc_query"] == measures["wrong_negative"] == 1.0
  assert measures["collateral_blame"] == measures["no_signal"] == 0.0


def test_chain_rollouts_label_the_optimal_action_right():
  """The credit bench's rollouts: +1 exactly on advancing the chain and on answering at its
  end, so the optimal policy's rows are right throughout and a random policy's mixed."""
  task = ChainTask()
  rng = np.random.default_rng(0)
  opts = chain_rollouts.ChainRolloutOptions(kind="independent", num_queries=4)
  uniform = np.log(np.full((task.num_states, task.num_actions), 1.0 / task.num_actions))
  r = chain_rollouts.sample_batch(rng, task, uniform, opts).rollouts
  label, sv = np.asarray(r.turn_label), np.asarray(r.step_valid)
  solves = np.asarray(r.call_solves)[:, :, 0]
  correct_answer = (np.arange(r.max_steps)[None] == np.asarray(r.num_steps)[:, None] - 1) & (
      np.asarray(r.outcome) == 1)[:, None]
  np.testing.assert_array_equal(label[sv] == 1, (solves | correct_answer)[sv])
  assert (label[sv] == -1).any() and not label[~sv].any()
