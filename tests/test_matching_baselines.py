"""matchtir_km, matchtir_ot, toolrl and ftrl (spec §4.3) against references and worked rows."""

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

from tirjax.rollouts import to_numpy
from tirjax.testing.call_batches import SHAPES, from_rows, random_batch, repad
from tirjax.testing.reference import REFERENCES
from tirjax import advantages
from tirjax.advantages.matchtir import MatchTIRKMOptions, MatchTIROTOptions
from tirjax.advantages.toolrl import ToolRLOptions
from tirjax.testing.records import GroupRecord, RowRecord, StepRecord, build_rollouts
from tirjax.testing.synthetic_calls import random_call_rollouts


def compare(name, r, opts=None, atol=2e-5):
  est = advantages.get(name)
  opts = opts or est.options()
  out = est(r, opts)
  ref = REFERENCES[name](to_numpy(r), **{f: getattr(opts, f) for f in opts.__dataclass_fields__})
  np.testing.assert_allclose(np.asarray(out.steps), ref["steps"], atol=atol)
  np.testing.assert_allclose(np.asarray(out.rows), ref["rows"], atol=atol)
  assert np.all(np.isfinite(np.asarray(out.tokens)))
  return out


@hypothesis.given(seed=st.integers(0, 2**31 - 1), shape=st.sampled_from(sorted(SHAPES)))
@hypothesis.settings(max_examples=40)
def test_matchtir_km_matches_reference(seed, shape):
  compare("matchtir_km", random_batch(np.random.default_rng(seed), SHAPES[shape]))


@hypothesis.given(seed=st.integers(0, 2**31 - 1))
@hypothesis.settings(max_examples=30)
def test_matchtir_km_greedy_matches_reference_with_ties(seed):
  r = random_batch(np.random.default_rng(seed), SHAPES["wide"], ties=True)
  compare("matchtir_km", r, MatchTIRKMOptions(matching="greedy", discount=0.5))


@hypothesis.given(seed=st.integers(0, 2**31 - 1), shape=st.sampled_from(sorted(SHAPES)))
@hypothesis.settings(max_examples=30)
def test_matchtir_ot_matches_reference(seed, shape):
  compare("matchtir_ot", random_batch(np.random.default_rng(seed), SHAPES[shape]), atol=1e-4)


def test_matchtir_worked_group():
  r = from_rows([
      dict(group=0, steps=[[{0: 0.8}], []], answered=True, answer_score=1.0, outcome=1.0),
      dict(group=0, steps=[[{0: 0.5}, {1: 1.0}], []], answered=True, answer_score=0.0),
      dict(group=0, steps=[[{0: 0.3}], [{1: 0.4}]]),
  ], num_gt=2)
  out = advantages.get("matchtir_km")(r)
  # Turn rewards (0.8, 1), (0.75, 0), (0.3, 0.4); sums 1.8, 0.75, 0.7 → A_traj; discounted
  # returns G = (1.7, 1), (0.75, 0), (0.66, 0.4) z-scored per turn index; A = mean of both.
  np.testing.assert_allclose(np.asarray(out.extras["turn_return"]),
                             [[1.7, 1.0], [0.75, 0.0], [0.66, 0.4]], atol=1e-6)
  np.testing.assert_allclose(np.asarray(out.rows), [1.153763, -0.536634, -0.617129], atol=1e-5)
  np.testing.assert_allclose(np.asarray(out.steps), [[1.152468, 1.106693], [-0.517063, -0.731902],
                                                     [-0.635405, -0.374791]], atol=1e-5)


def add(a, b):
  return {"name": "add", "arguments": {"a": a, "b": b}}


def mul(a, b):
  return {"name": "mul", "arguments": {"a": a, "b": b}}


def test_toolrl_worked_rows():
  answer = {"name": "response_gen", "arguments": {"answer": "42"}}
  r = build_rollouts([GroupRecord(gt_calls=[add(1, 2), mul(3, 4)], rows=[
      RowRecord(outcome=1, steps=[StepRecord(calls=[add(1, 2)]),
                                  StepRecord(calls=[mul(3, 4), add(1, 1)]),
                                  StepRecord(calls=[answer])]),
      RowRecord(outcome=-1, steps=[StepRecord(calls=[add(1, 3)]), StepRecord(calls=[])]),
      RowRecord(outcome=1, steps=[StepRecord(calls=[mul(3, 4)], format_reward=-0.05)]),
  ])])
  out = advantages.get("toolrl")(r)
  x = {k: np.asarray(v) for k, v in out.extras.items()}
  # S_max = 1 + (1 + 2) + (1 + 2) = 7. Row 0: names {add, mul, add} vs {add, mul} → 2/3,
  # two exact pairs 3 + 3. Row 1: names 1/2, add(1, 3) ↔ add(1, 2): key Jaccard 1 + one value.
  # Row 2: names 1/2, one exact pair; its step passed only 2 format checks → format 0.
  np.testing.assert_allclose(x["name_score"], [2 / 3, 0.5, 0.5], atol=1e-6)
  np.testing.assert_allclose(x["r_max"], [2 / 3 + 6, 2.5, 3.5], atol=1e-5)
  np.testing.assert_allclose(x["format"], [1, 1, 0])
  want = np.array([1 + 6 * (20 / 3) / 7 - 3, 1 + 6 * 2.5 / 7 - 3, 0 + 6 * 3.5 / 7 - 3])
  np.testing.assert_allclose(np.asarray(out.row_reward), want, atol=1e-5)
  compare("toolrl", r)


@hypothesis.given(seed=st.integers(0, 2**31 - 1), checks=st.sampled_from([3, 5]))
@hypothesis.settings(max_examples=25)
def test_toolrl_matches_reference(seed, checks):
  r = random_call_rollouts(seed, num_queries=3, group_size=4, max_steps=3, max_calls=2,
                           max_gt_calls=3, max_params=3, num_tools=3, num_keys=4, num_values=2)
  compare("toolrl", r, ToolRLOptions(format_checks=checks))


def test_ftrl_worked_rows():
  two_checks = 0.25 * (2 * 2 / 5 - 1)
  r = from_rows([
      dict(group=0, steps=[[{}, {}], [{}]], solves=[[True, False], [True]]),  # 2·2/(3+1)
      dict(group=0, steps=[[]], format=[two_checks]),  # malformed call: −0.3
      dict(group=0, steps=[[]]),  # no answer: −0.5
      dict(group=0, steps=[[]], answered=True, outcome=1.0, num_expected=2),  # 1/(1+2)
      dict(group=0, steps=[[]], answered=True, num_expected=0),  # nothing to solve: 0.5
      dict(group=0, steps=[[]], answered=True, num_expected=2),  # wrong answer: 0
  ], num_gt=0)
  out = advantages.get("ftrl")(r)
  np.testing.assert_allclose(np.asarray(out.row_reward), [1.0, -0.3, -0.5, 1 / 3, 0.5, 0.0],
                             atol=1e-6)
  compare("ftrl", r)


@hypothesis.given(seed=st.integers(0, 2**31 - 1), shape=st.sampled_from(sorted(SHAPES)))
@hypothesis.settings(max_examples=30)
def test_ftrl_matches_reference(seed, shape):
  compare("ftrl", random_batch(np.random.default_rng(seed), SHAPES[shape]))


def test_ftrl_on_generated_calls_matches_reference():
  for seed in range(3):
    compare("ftrl", random_call_rollouts(seed, num_queries=4, group_size=3, max_steps=3,
                                         max_calls=2, max_gt_calls=3, max_params=2))


@hypothesis.given(seed=st.integers(0, 2**31 - 1),
                  name=st.sampled_from(["matchtir_km", "matchtir_ot", "ftrl"]))
@hypothesis.settings(max_examples=15)
def test_padding_invariance(seed, name):
  rng = np.random.default_rng(seed)
  r = random_batch(rng, SHAPES["square"])
  positions = rng.permutation(11)[:8]
  est = advantages.get(name)
  small, large = est(r), est(repad(r, (11, 4, 3, 7), positions))
  np.testing.assert_allclose(np.asarray(large.steps)[positions, :3], np.asarray(small.steps),
                             atol=1e-5)
  np.testing.assert_allclose(np.asarray(large.rows)[positions], np.asarray(small.rows), atol=1e-5)
  padding = np.setdiff1d(np.arange(11), positions)
  assert np.all(np.asarray(large.steps)[padding] == 0)


def test_degenerate_inputs_are_finite():
  shape = (4, 2, 2, 2)
  cases = [from_rows([], num_gt=0, shape=shape),
           from_rows([dict(group=0, steps=[[{}]]), dict(group=0, steps=[[]])], num_gt=0,
                     shape=shape),
           from_rows([dict(group=0, steps=[[{0: 1.0}]]), dict(group=1, steps=[[]])], num_gt=1,
                     shape=shape)]
  for name in ("matchtir_km", "matchtir_ot", "ftrl"):
    for r in cases:
      out = compare(name, r, atol=1e-4)
      for leaf in (out.steps, out.rows, *out.extras.values()):
        assert np.all(np.isfinite(np.asarray(leaf)))
  empty = random_call_rollouts(0, num_queries=2, group_size=2, max_steps=2, max_calls=2,
                               max_gt_calls=2, max_params=2, p_filtered=1.0)
  out = advantages.get("toolrl")(empty)
  assert np.all(np.asarray(out.tokens) == 0) and np.all(np.asarray(out.rows) == 0)


def test_required_inputs_and_options():
  r = random_batch(np.random.default_rng(0), SHAPES["wide"])
  with pytest.raises(ValueError, match="calls"):
    advantages.get("toolrl")(r)
  with pytest.raises(ValueError, match="call_solves"):
    advantages.get("ftrl")(r.replace(call_solves=None, num_expected=None))
  for make, bad, match in [(MatchTIRKMOptions, dict(matching="km"), "matching"),
                           (MatchTIRKMOptions, dict(discount=1.5), "discount"),
                           (MatchTIROTOptions, dict(reg=0.0), "reg"),
                           (MatchTIROTOptions, dict(max_iter=0), "max_iter"),
                           (ToolRLOptions, dict(format_checks=6), "format_checks")]:
    with pytest.raises(ValueError, match=match):
      make(**bad)
