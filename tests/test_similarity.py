"""Device similarity (encoding + Eq. 22-25) against the plain-Python reference."""

import hypothesis
import hypothesis.strategies as st
import numpy as np

from tirjax.testing.reference.similarity import similarity
from tirjax.testing.records import GroupRecord, RowRecord, StepRecord, build_rollouts

# Few names, keys and values, so that names, keys and values often coincide.
NAMES = st.sampled_from(["add", "mul", "search"])
KEYS = st.sampled_from(["a", "b", "query", "k"])
SCALARS = st.one_of(
    st.sampled_from([0, 1, 1.0, 2, 2.5, -0.0, 0.0, True, False, None, "1", "x", "", 2**53,
                     2**53 + 1, float(2**53)]),
    st.integers(-3, 3))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(KEYS, inner, max_size=3)), max_leaves=6)
CALLS = st.fixed_dictionaries({"name": NAMES,
                               "arguments": st.dictionaries(KEYS, VALUES, max_size=4)})
SHAPE = dict(max_steps=3, max_calls=3, max_gt_calls=4, max_params=4, max_tokens=8)


@hypothesis.given(preds=st.lists(st.lists(CALLS, max_size=3), min_size=1, max_size=3),
                  gts=st.lists(CALLS, max_size=4))
def test_call_sim_matches_reference(preds, gts):
  steps = [StepRecord(calls=calls) for calls in preds]
  r = build_rollouts([GroupRecord(gt_calls=gts, rows=[RowRecord(steps=steps, outcome=1)])],
                     num_rows=1, **SHAPE)
  got = np.asarray(r.call_sim)[0]
  want = np.zeros_like(got)
  for t, calls in enumerate(preds):
    for k, call in enumerate(calls):
      for c, gt in enumerate(gts):
        want[t, k, c] = similarity(call, gt)
  np.testing.assert_allclose(got, want, atol=1e-6)


def test_json_value_semantics():
  gt = {"name": "f", "arguments": {"a": 1, "b": {"x": [1, "s"], "y": True}, "c": 2**53 + 1}}
  cases = [
      ({"a": 1.0, "b": {"y": True, "x": [1.0, "s"]}, "c": 2**53 + 1}, 1.0),  # all equal
      ({"a": True, "b": {"x": [1, "s"], "y": 1}, "c": float(2**53)}, 2 / 5),  # bool ≠ 1, 2**53
      ({"a": "1", "b": {"x": ["s", 1], "y": True}}, (1 + 2 / 3) / 5),  # string, list order
      ({}, 1 / 5),  # missing keys: J = 0
      ({"a": 1, "b": {"x": [1, "s"], "y": True}, "c": 2**53 + 1, "d": 0}, (1 + 3 / 4 + 3) / 5),
  ]
  for args, want in cases:
    r = build_rollouts([GroupRecord(gt_calls=[gt], rows=[RowRecord(
        steps=[StepRecord(calls=[{"name": "f", "arguments": args}])], outcome=1)])])
    np.testing.assert_allclose(float(r.call_sim[0, 0, 0, 0]), want, rtol=1e-6, err_msg=str(args))
    assert similarity({"name": "f", "arguments": args}, gt) == want


def test_empty_argument_sets_and_names():
  def sim(pred, gt):
    r = build_rollouts([GroupRecord(gt_calls=[gt], rows=[RowRecord(
        steps=[StepRecord(calls=[pred])], outcome=1)])], max_params=1)
    return float(r.call_sim[0, 0, 0, 0])
  assert sim({"name": "f", "arguments": {}}, {"name": "f", "arguments": {}}) == 1.0  # J(∅,∅)=1
  assert sim({"name": "f"}, {"name": "f", "arguments": None}) == 1.0
  assert sim({"name": "f", "arguments": {"a": 1}}, {"name": "f"}) == np.float32(0.5)  # J = 0
  assert sim({"name": "g", "arguments": {}}, {"name": "f", "arguments": {}}) == 0.0
