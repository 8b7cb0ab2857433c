"""GiGPO and Tree-GRPO (spec §4.4) against their loop references, worked examples and the
relations to GRPO that define them."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

from tirjax.testing.estimator_checks import check_padding, check_reference, check_row_permutation
from tirjax.testing.strategies import tree_batches
from tirjax import advantages, segments
from tirjax.advantages.gigpo import GiGPOOptions
from tirjax.advantages.tree_grpo import TreeGRPOOptions
from tirjax.testing.records import GroupRecord, RowRecord, StepRecord, build_rollouts

VARIANTS = (
    ("gigpo", GiGPOOptions()),
    ("gigpo", GiGPOOptions(anchor="prefix")),
    ("gigpo", GiGPOOptions(gamma=1.0, omega=0.5, zscore=segments.ZScore(scale="none"))),
    ("gigpo", GiGPOOptions(gamma=0.0, zscore=segments.ZScore(ddof=0, singleton="raw"))),
    ("gigpo", GiGPOOptions(episode_stats="step")),
    ("tree_grpo", TreeGRPOOptions()),
    ("tree_grpo", TreeGRPOOptions(segments.ZScore(scale="none"))),
)
NAMES = ("gigpo", "tree_grpo")
ADD = {"name": "add", "arguments": {"a": 1}}
MUL = {"name": "mul", "arguments": {"a": 2}}
ANSWER = {"name": "response_gen", "arguments": {"answer": "3"}}


@given(tree_batches(), st.integers(0, 2**32 - 1))
def test_reference_row_permutation_and_padding(r, seed):
  """Against the loop reference for every variant; rows reordered, outputs reordered; padding
  rows, steps, calls and tokens change nothing."""
  check_reference(r, VARIANTS)
  check_row_permutation(r, seed, NAMES)
  check_padding(r, seed, NAMES)


@given(tree_batches())
def test_gigpo_without_step_term_is_grpo(r):
  gigpo = advantages.get("gigpo")(r, GiGPOOptions(omega=0.0))
  np.testing.assert_allclose(gigpo.steps, advantages.get("grpo")(r).steps, atol=1e-6)


@given(tree_batches(kinds=("independent",)))
def test_tree_grpo_on_independent_rollouts_is_grpo(r):
  """Every tree is one row: the intra-tree z-score is 0."""
  np.testing.assert_allclose(advantages.get("tree_grpo")(r).steps,
                             advantages.get("grpo")(r).steps, atol=1e-6)


def test_gigpo_worked_group():
  """Three rows: two make the same first call (different think text: different nodes) and
  then differ; the third calls another tool first. γ = 0.5.

  Episode: R = (1, -1, -1) → z = (2/√3, -1/√3, -1/√3) (ddof 1: std = 2/√3).
  Step 1: all three stand in the query's initial state: returns γ^(T−1)·R = (0.5, -0.5, -1)
  (T = 2, 2, 1) → mean -1/3, std √(7/12) → z = (5/6, -1/6, -2/3)/√(7/12).
  Step 2: rows 0 and 1 saw the same call and response (one anchor state): returns (1, -1) →
  z = ±1/√2 (std √2); row 2 has no second step.
  """
  rows = [RowRecord(outcome=1, steps=[StepRecord(calls=[ADD], tokens=(4,)),
                                      StepRecord(calls=[ANSWER], tokens=(6,))]),
          RowRecord(outcome=-1, steps=[StepRecord(calls=[ADD], tokens=(5,)),
                                       StepRecord(calls=[MUL], tokens=(6,))]),
          RowRecord(outcome=-1, steps=[StepRecord(calls=[MUL], tokens=(4,))])]
  r = build_rollouts([GroupRecord(gt_calls=[ADD], rows=rows)])
  assert np.asarray(r.state_id)[0, 1] == np.asarray(r.state_id)[1, 1]
  assert np.asarray(r.node_id)[0, 0] != np.asarray(r.node_id)[1, 0]
  out = advantages.get("gigpo")(r, GiGPOOptions(gamma=0.5))
  episode = np.array([2, -1, -1]) / np.sqrt(3)
  first = np.array([5 / 6, -1 / 6, -2 / 3]) / np.sqrt(7 / 12)
  second = np.array([1, -1]) / np.sqrt(2)
  np.testing.assert_allclose(out.rows, episode, rtol=1e-5, atol=2e-6)
  np.testing.assert_allclose(np.asarray(out.steps)[:, 0], episode + first, rtol=1e-5, atol=2e-6)
  np.testing.assert_allclose(np.asarray(out.steps)[:2, 1], episode[:2] + second, rtol=1e-5,
                             atol=2e-6)
  np.testing.assert_allclose(out.extras["step_group_size"], [[3, 2], [3, 2], [3, 0]])
  # "prefix" anchors: the second steps have different parents, so they stand alone (A^S = 0).
  prefix = advantages.get("gigpo")(r, GiGPOOptions(gamma=0.5, anchor="prefix"))
  np.testing.assert_allclose(np.asarray(prefix.steps)[:2, 1], episode[:2], rtol=1e-5, atol=2e-6)


def test_gigpo_episode_statistics_per_trajectory_or_per_step():
  """Rows (R = 1, 1 step) and (R = 0, 3 steps). Per trajectory: mean 0.5, std 1/√2 → ±1/√2.
  Per step (verl-agent's shipped default): values (1, 0, 0, 0), mean 0.25, std 0.5 →
  (1.5, −0.5)."""
  rows = [RowRecord(outcome=1, steps=[StepRecord(calls=[ADD])]),
          RowRecord(outcome=0, steps=[StepRecord(calls=[MUL]), StepRecord(calls=[ADD]),
                                      StepRecord(calls=[MUL])])]
  r = build_rollouts([GroupRecord(gt_calls=[ADD], rows=rows)])
  est = advantages.get("gigpo")
  np.testing.assert_allclose(est(r, GiGPOOptions(omega=0.0)).rows, [2 ** -0.5, -2 ** -0.5],
                             rtol=1e-5)
  np.testing.assert_allclose(est(r, GiGPOOptions(omega=0.0, episode_stats="step")).rows,
                             [1.5, -0.5], rtol=1e-5)


def test_tree_grpo_worked_tree():
  """Two trees under one query: tree a = rows (1, -1), tree b = rows (1, 1, -1).
  Inter: R = (1, -1, 1, 1, -1), mean 0.2, std √1.2. Intra a: ±1/√2; intra b: mean 1/3,
  std √(4/3) → (1/√3, 1/√3, -2/√3)."""
  def row(first, second, outcome):
    return RowRecord(outcome=outcome, steps=[StepRecord(node=first), StepRecord(node=second)])
  r = build_rollouts([GroupRecord(rows=[row("a", "a1", 1), row("a", "a2", -1), row("b", "b1", 1),
                                        row("b", "b2", 1), row("b", "b3", -1)])])
  outcome = np.array([1, -1, 1, 1, -1.0])
  inter = (outcome - 0.2) / np.sqrt(1.2)
  intra = np.array([1, -1, 1, 1, -2]) / np.array([np.sqrt(2)] * 2 + [np.sqrt(3)] * 3)
  out = advantages.get("tree_grpo")(r)
  np.testing.assert_allclose(out.rows, inter + intra, rtol=1e-5, atol=2e-6)
  np.testing.assert_allclose(out.extras["intra_tree"], intra, rtol=1e-5, atol=2e-6)


def test_tree_grpo_on_one_row_trees_is_grpo_or_the_codes_raw_reward():
  """R = (1, 0, 0) on independent rows: spec §3 gives the one-row trees 0 (GRPO's
  (1.155, −0.577, −0.577)); `singleton="raw"` adds the raw reward, as Tree-GRPO's code does."""
  r = build_rollouts([GroupRecord(rows=[RowRecord(outcome=o, steps=[StepRecord()])
                                        for o in (1, 0, 0)])])
  grpo = np.array([2, -1, -1]) / np.sqrt(3)
  est = advantages.get("tree_grpo")
  np.testing.assert_allclose(est(r).rows, grpo, rtol=1e-5)
  raw = TreeGRPOOptions(segments.ZScore(singleton="raw"))
  np.testing.assert_allclose(est(r, raw).rows, grpo + [1, 0, 0], rtol=1e-5)


def test_gigpo_state_anchor_needs_state_ids():
  r = build_rollouts([GroupRecord(rows=[RowRecord(outcome=1, steps=[StepRecord()])])])
  with pytest.raises(ValueError, match="state_id"):
    advantages.get("gigpo")(r.replace(state_id=None))
  advantages.get("gigpo")(r.replace(state_id=None), GiGPOOptions(anchor="prefix"))


@pytest.mark.parametrize("make, field", [
    (lambda: GiGPOOptions(gamma=-0.1), "gamma"),
    (lambda: GiGPOOptions(omega=float("nan")), "omega"),
    (lambda: GiGPOOptions(anchor="node"), "anchor"),
    (lambda: GiGPOOptions(zscore="std"), "zscore"),
    (lambda: TreeGRPOOptions(zscore=None), "zscore"),
])
def test_invalid_options_name_the_option(make, field):
  with pytest.raises(ValueError, match=field):
    make()
