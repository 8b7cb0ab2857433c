"""`records.build_rollouts`: layout of rows, steps, trees, calls and tokens."""

import numpy as np
import pytest

from tirjax.testing.records import GroupRecord, RowRecord, StepRecord, build_rollouts

ADD = {"name": "add", "arguments": {"a": 1, "b": 2}}
ADD_WRONG = {"name": "add", "arguments": {"a": 1, "b": 5}}
ANSWER = {"name": "response_gen", "arguments": {"answer": "3"}}


def tree_groups():
  return [
      GroupRecord(gt_calls=[ADD], num_expected=2, rows=[
          RowRecord(outcome=1, prompt_tokens=(11, 12), steps=[
              StepRecord(node="s", calls=[ADD], tokens=(1, 2), logprobs=(-0.5, -0.25),
                         response_tokens=(7,), solves=[True], format_reward=0.15),
              StepRecord(node="s1", calls=[ANSWER], tokens=(3,))]),
          RowRecord(outcome=-1, steps=[
              StepRecord(node="s", calls=[ADD], tokens=(1, 2), response_tokens=(7,),
                         format_reward=0.15),
              StepRecord(node="s2", calls=[ADD_WRONG]), StepRecord()]),
      ]),
      GroupRecord(rows=[RowRecord(outcome=0, steps=[StepRecord(node="s")],
                                  answer_score=0.5, policy_version=3)]),
  ]


def test_layout():
  r = build_rollouts(tree_groups(), with_ftrl=True, with_ref=True)
  assert (r.num_rows, r.max_steps, r.max_calls, r.max_gt_calls) == (3, 3, 1, 1)
  np.testing.assert_array_equal(r.group_id, [0, 0, 1])
  np.testing.assert_array_equal(r.num_steps, [2, 3, 1])
  np.testing.assert_array_equal(r.outcome, [1, -1, 0])
  # Shared label "s" in group 0 is one node; the same label in group 1 is another; unlabelled
  # steps are fresh nodes.
  nid = np.asarray(r.node_id)
  assert nid[0, 0] == nid[1, 0] and nid[2, 0] != nid[0, 0]
  assert len({nid[0, 1], nid[1, 1], nid[1, 2], nid[2, 0], nid[0, 0]}) == 5
  assert nid[0, 2] == -1 and nid[2, 1] == -1
  np.testing.assert_allclose(r.format_reward[0, 0], 0.15)
  # The terminal tool is not a matched call; the answering step is marked by `answered`.
  np.testing.assert_array_equal(r.call_valid[:, :, 0], [[1, 0, 0], [1, 1, 0], [0, 0, 0]])
  np.testing.assert_array_equal(r.answered, [True, False, True])
  np.testing.assert_allclose(r.answer_score, [1.0, 0.0, 0.5])
  np.testing.assert_array_equal(r.policy_version, [0, 0, 3])
  # Exact call: similarity 1; same name and keys, one value wrong: (1 + 1 + 1) / (2 + 2).
  np.testing.assert_allclose(r.call_sim[0, 0, 0, 0], 1.0, rtol=1e-6)
  np.testing.assert_allclose(r.call_sim[1, 1, 0, 0], 0.75, rtol=1e-6)
  np.testing.assert_array_equal(r.gt_valid[:, 0], [True, True, False])
  np.testing.assert_array_equal(r.call_solves[0, 0], [True])
  np.testing.assert_array_equal(r.num_expected, [2, 2, 0])
  assert r.ref_logprobs is not None


def test_tokens():
  r = build_rollouts(tree_groups())
  # Row 0: prompt (11, 12), step 0 (1, 2), response (7,), step 1 (3,).
  assert r.max_tokens == 6
  np.testing.assert_array_equal(r.tokens[0], [11, 12, 1, 2, 7, 3])
  np.testing.assert_array_equal(r.token_valid[0], [1, 1, 1, 1, 1, 1])
  np.testing.assert_array_equal(r.loss_mask[0], [0, 0, 1, 1, 0, 1])
  np.testing.assert_array_equal(r.token_step[0], [-1, -1, 0, 0, -1, 1])
  np.testing.assert_allclose(r.old_logprobs[0], [0, 0, -0.5, -0.25, 0, 0])
  # Row 2: prompt (1,), one step of one token, then right padding.
  np.testing.assert_array_equal(r.token_valid[2], [1, 1, 0, 0, 0, 0])
  np.testing.assert_array_equal(r.token_step[2], [-1, 0, -1, -1, -1, -1])
  assert r.calls is not None and r.call_solves is None and r.ref_logprobs is None


def test_pads_to_given_shapes():
  r = build_rollouts(tree_groups(), num_rows=8, max_steps=5, max_calls=3, max_gt_calls=2,
                     max_tokens=20, max_params=4)
  assert (r.num_rows, r.max_steps, r.max_calls, r.max_gt_calls, r.max_tokens) == (8, 5, 3, 2, 20)
  assert r.calls.pred_keys.shape == (8, 5, 3, 4)
  np.testing.assert_array_equal(r.row_valid, [1, 1, 1, 0, 0, 0, 0, 0])
  assert not np.any(np.asarray(r.step_valid)[3:]) and not np.any(np.asarray(r.token_valid)[3:])


def test_empty_batch_is_all_padding():
  r = build_rollouts([], num_rows=4, max_steps=2)
  assert r.num_rows == 4 and not np.any(r.row_valid)


@pytest.mark.parametrize("size, need", [("num_rows", 3), ("max_steps", 3), ("max_tokens", 6)])
def test_too_small_shapes_are_named(size, need):
  with pytest.raises(ValueError, match=f"{size}={need - 1} is too small"):
    build_rollouts(tree_groups(), **{size: need - 1})
