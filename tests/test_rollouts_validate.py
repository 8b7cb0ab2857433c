"""`rollouts.validate`: every contract rule raises `RolloutsError` naming its field."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from tirjax.testing.records import GroupRecord, RowRecord, StepRecord, build_rollouts
from tirjax import rollouts
from tirjax.rollouts import Rollouts, RolloutsError, step_to_tokens, validate

ADD = {"name": "add", "arguments": {"a": 1, "b": 2}}
MUL = {"name": "mul", "arguments": {"a": 3}}


def base() -> Rollouts:
  """Two queries, a shared node, a row without steps, padding rows, a spare gt slot."""
  return build_rollouts([
      GroupRecord(gt_calls=[ADD], num_expected=1, rows=[
          RowRecord(outcome=1, steps=[StepRecord(node="s", calls=[ADD], tokens=(5, 6)),
                                      StepRecord(node="s1", calls=[MUL])]),
          RowRecord(outcome=-1, steps=[StepRecord(node="s", calls=[ADD], tokens=(5, 6)),
                                       StepRecord(node="s2")]),
      ]),
      GroupRecord(gt_calls=[MUL, ADD], rows=[
          RowRecord(outcome=0, steps=[StepRecord(calls=[MUL, ADD], response_tokens=(9,))]),
          RowRecord(outcome=-1, steps=[]),
      ]),
  ], num_rows=6, max_steps=3, max_calls=2, max_gt_calls=3, max_tokens=10, with_ftrl=True,
     with_ref=True, with_greedy=True)


def arrays(r: Rollouts) -> dict:
  return {f.name: np.array(getattr(r, f.name)) for f in dataclasses.fields(r)
          if isinstance(getattr(r, f.name), jnp.ndarray)}


def mutated(change) -> Rollouts:
  r = base()
  a = arrays(r)
  out = change(a)
  a = out if out is not None else a
  return r.replace(**{k: jnp.asarray(v) if v is not None else None for k, v in a.items()})


def _set(name, index, value):
  def change(a):
    a[name][index] = value
  return change


def _first_padding_step(a):
  b = 0
  return b, int(a["num_steps"][b])


CASES = [
    ("group_id", lambda a: {**a, "group_id": a["group_id"][:, None]}),
    ("step_valid", lambda a: {**a, "step_valid": a["step_valid"][..., None]}),
    ("outcome", lambda a: {**a, "outcome": a["outcome"][:-1]}),
    ("outcome", lambda a: {**a, "outcome": a["outcome"].astype(np.int32)}),
    ("row_valid", lambda a: {**a, "row_valid": a["row_valid"].astype(np.int32)}),
    ("ref_logprobs", lambda a: {**a, "ref_logprobs": a["ref_logprobs"][:, :-1]}),
    ("old_logprobs", _set("old_logprobs", (0, 0), np.nan)),
    ("call_sim", _set("call_sim", (0, 0, 0, 0), np.inf)),
    ("group_id", _set("group_id", 5, 6)),
    ("group_id", _set("group_id", 0, -1)),
    ("outcome", _set("outcome", 0, 0.5)),
    ("num_steps", _set("num_steps", 0, 4)),
    ("step_valid", _set("step_valid", (0, 2), True)),
    ("step_valid", _set("step_valid", (4, 0), True)),
    ("answered", _set("answered", 5, True)),
    ("answered", _set("answered", 3, True)),
    ("format_reward", _set("format_reward", (0, 0), 0.3)),
    ("call_valid", _set("call_valid", (0, 2, 0), True)),
    ("call_sim", _set("call_sim", (0, 0, 0, 0), 1.5)),
    ("call_sim", _set("call_sim", (0, 0, 1, 0), 0.5)),  # step 0 of row 0 has one call
    ("gt_valid", _set("gt_valid", (5, 0), True)),
    ("gt_valid", _set("gt_valid", (0, 2), True)),  # rows 0 and 1 disagree
    ("answer_score", _set("answer_score", 0, 1.5)),
    ("node_id", _set("node_id", (0, 2), 7)),
    ("node_id", _set("node_id", (0, 1), 18)),
    ("node_id", _set("node_id", (2, 0), 0)),  # another query's node
    ("node_id", _set("node_id", (1, 1), 0)),  # a node at two depths
    ("format_reward", _set("format_reward", (1, 0), 0.2)),  # shared node "s", another R_fm
    ("token_valid", _set("token_valid", (0, 9), True)),
    ("token_valid", _set("token_valid", (5, 0), True)),
    ("loss_mask", _set("loss_mask", (0, 9), True)),
    ("token_step", _set("token_step", (0, 0), 0)),  # on the prompt token
    ("token_step", _set("token_step", (0, 1), 2)),  # beyond num_steps
    ("greedy_outcome", _set("greedy_outcome", 0, 0.5)),
    ("greedy_outcome", _set("greedy_outcome", 0, 1.0)),  # rows 0 and 1 (one query) disagree
    ("state_id", _set("state_id", (0, 2), 3)),  # on a padding step
    ("state_id", _set("state_id", (0, 1), 18)),  # B*T = 18
    ("state_id", lambda a: _set("state_id", (2, 0), a["state_id"][0, 0])(a)),  # another query's
    ("state_id", lambda a: _set("state_id", (0, 1), a["state_id"][0, 0])(a)),  # at two depths
    ("state_id", _set("state_id", (1, 0), 17)),  # shared node "s", two states
    # ... with fresh ids for row 1's later steps too: only the one-state-per-node rule fires
    ("state_id", lambda a: [_set("state_id", (1, t), 17 - t)(a) for t in (0, 1)] and None),
    ("calls.pred_name", lambda a: None),  # replaced below
    ("call_solves", lambda a: {**a, "num_expected": None}),
]


@pytest.mark.parametrize("field, change", CASES, ids=[f"{i}-{f}" for i, (f, _) in enumerate(CASES)])
def test_each_rule_names_its_field(field, change):
  if field == "calls.pred_name":
    r = base()
    bad = r.calls.replace(pred_name=r.calls.pred_name[:, :, :1])
    r = r.replace(calls=bad)
  else:
    r = mutated(change)
  with pytest.raises(RolloutsError, match=f"^{field}"):
    validate(r)


def test_base_batch_is_valid_and_as_built():
  r = validate(base())
  assert (r.num_rows, r.max_steps, r.max_calls, r.max_gt_calls, r.max_tokens) == (6, 3, 2, 3, 10)
  np.testing.assert_array_equal(r.row_valid, [1, 1, 1, 1, 0, 0])


def test_state_ids_key_steps_by_their_group_and_history():
  """Equal histories of step keys share a state, whatever the rows; another group, another
  depth or another earlier key gives another state; padding steps get -1."""
  group = np.array([0, 0, 0, 1, 0])
  key = np.array([[5, 7, 1], [5, 7, 2], [6, 7, 1], [5, 7, 1], [9, 9, 9]])
  valid = np.array([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 0], [0, 0, 0]], bool)
  ids = rollouts.state_ids(group, key, valid)
  assert ids[0, 0] == ids[1, 0] == ids[2, 0] != ids[3, 0]  # the query's initial state
  assert ids[0, 1] == ids[1, 1] != ids[2, 1]  # after key 5, not after key 6
  assert ids[0, 2] != ids[2, 2] and ids[3, 1] not in ids[:3].ravel()
  assert np.all(ids[~valid] == -1) and sorted(set(ids[valid].tolist())) == list(range(7))


def test_step_to_tokens():
  steps = jnp.array([[1.0, 2.0, 3.0]])
  np.testing.assert_array_equal(step_to_tokens(steps, jnp.array([[-1, 0, 0, 2, -1]])),
                                [[0.0, 1.0, 1.0, 3.0, 0.0]])


def test_padding_values_live_in_the_contract_and_round_trip():
  r = base()
  a = rollouts.to_numpy(r)
  assert "calls.pred_name" in a and "ref_logprobs" in a
  back = rollouts.to_numpy(rollouts.from_numpy(a))
  assert set(back) == set(a) and all(np.array_equal(back[k], a[k]) for k in a)
  empty = rollouts.from_numpy(rollouts.empty_arrays(B=3, T=2, K=2, C=1, L=4))
  assert not np.any(empty.row_valid) and np.all(np.asarray(empty.node_id) == -1)
  assert np.all(np.asarray(empty.token_step) == -1) and empty.ref_logprobs is None
  assert rollouts.fill_value("calls.gt_keys") == -1 and rollouts.fill_value("outcome") == 0.0
  assert rollouts.field_axes("calls.gt_keys") == "BCP" and rollouts.field_axes("call_sim") == "BTKC"


def test_take_rows_keeps_the_rows_in_order_and_pads_the_rest():
  r = base()
  taken = rollouts.take_rows(r, [2, 0], num_rows=4)
  src = rollouts.to_numpy(r)
  for name, value in taken.items():
    assert np.array_equal(value[0], src[name][2]) and np.array_equal(value[1], src[name][0])
    assert np.all(value[2:] == rollouts.fill_value(name)), name
  with pytest.raises(ValueError, match="do not fit num_rows=1"):
    rollouts.take_rows(r, [0, 1], num_rows=1)


def test_take_rows_puts_padding_rows_where_asked():
  r = base()
  taken = rollouts.take_rows(r, [-1, 3, -1], num_rows=4)
  src = rollouts.to_numpy(r)
  for name, value in taken.items():
    assert np.array_equal(value[1], src[name][3]), name
    assert np.all(value[[0, 2, 3]] == rollouts.fill_value(name)), name
  for bad in ([-2], [r.num_rows]):
    with pytest.raises(ValueError, match=r"rows must be -1 \(padding\) or in \[0, 6\)"):
      rollouts.take_rows(r, bad, num_rows=4)


def test_take_groups_copies_kept_groups_renumbers_ids_and_moves_records():
  from tirjax.trainer.refill import take_groups
  Rec = dataclasses.make_dataclass("Rec", ["row", "group"])
  r = base()
  parts = [(r, [Rec(0, 0), Rec(1, 0), Rec(2, 1)]), (r, [Rec(2, 1), Rec(3, 1)])]
  out, records = take_groups(parts, [(1, 1), (0, 0)], num_rows=6)
  src, got = rollouts.to_numpy(r), rollouts.to_numpy(out)
  assert got["group_id"][:4].tolist() == [0, 0, 1, 1] and got["row_valid"].tolist() == [
      True] * 4 + [False] * 2
  for i, b in enumerate([2, 3, 0, 1]):
    assert np.array_equal(got["tokens"][i], src["tokens"][b])
  node = got["node_id"]
  assert sorted(set(node[node >= 0].tolist())) == list(range(len(set(node[node >= 0].tolist()))))
  assert node[2, 0] == node[3, 0]  # the shared node stays shared
  state = got["state_id"]
  assert state[2, 0] == state[3, 0] and state[2, 1] == state[3, 1]  # one history, one state
  assert len({state[0, 0], state[2, 0]}) == 2  # two queries' first states
  assert [(x.row, x.group) for x in records] == [(0, 0), (1, 0), (2, 1), (3, 1)]


def test_take_groups_renumbers_colliding_ids_of_different_batches():
  """Group 0 of two batches with the same node and state ids: after the merge the two groups
  share none (ids stay batch-global, so the merged batch validates)."""
  from tirjax.trainer.refill import take_groups
  r = base()
  out, _ = take_groups([(r, []), (r, [])], [(0, 0), (1, 0)], num_rows=6)
  got = rollouts.to_numpy(out)
  for name in ("node_id", "state_id"):
    first, second = got[name][:2], got[name][2:4]
    assert not set(first[first >= 0].tolist()) & set(second[second >= 0].tolist()), name
