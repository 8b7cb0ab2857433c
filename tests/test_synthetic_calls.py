"""The random call-batch generator: contract, paper-scale shapes, consistency of its fields."""

import numpy as np
import pytest

from tirjax.rollouts import validate
from tirjax.testing.synthetic_calls import random_call_rollouts


def test_paper_scale_shapes_and_contract():
  r = random_call_rollouts(0)  # validated inside
  assert r.call_sim.shape == (256 * 16, 10, 4, 8)
  assert r.calls.pred_keys.shape == (4096, 10, 4, 4) and r.calls.gt_keys.shape == (4096, 8, 4)
  sizes = np.bincount(np.asarray(r.group_id)[np.asarray(r.row_valid)], minlength=256)
  assert sizes.max() <= 16 and len(set(sizes.tolist())) > 1  # ragged groups
  sim, cv = np.asarray(r.call_sim), np.asarray(r.call_valid)
  assert 0.2 < np.mean(sim.max(axis=-1)[cv] == 1.0) < 0.8  # exact copies, and others


def test_fields_are_consistent():
  r = random_call_rollouts(3, num_queries=8, group_size=4, max_steps=4, max_calls=3,
                           max_gt_calls=4, max_params=3)
  validate(r)
  cv, solves = np.asarray(r.call_valid), np.asarray(r.call_solves)
  sim = np.asarray(r.call_sim)
  assert not np.any(solves & ~cv)
  assert np.all(sim.max(axis=-1)[solves] == 1.0)  # a solving call is an exact copy
  per_row = solves.reshape(len(solves), -1).sum(axis=1)
  assert np.all(per_row <= np.asarray(r.num_expected))
  assert np.array_equal(np.asarray(r.num_expected), np.asarray(r.gt_valid).sum(axis=1))
  enc = r.calls
  assert np.all((np.asarray(enc.pred_name) >= 0) == cv)
  assert np.all((np.asarray(enc.gt_name) >= 0) == np.asarray(r.gt_valid))
  keys = np.asarray(enc.pred_keys)
  for row in keys.reshape(-1, keys.shape[-1]):  # parameter names are distinct within a call
    named = row[row >= 0]
    assert len(set(named.tolist())) == len(named)


def test_seeded_and_checked():
  a = random_call_rollouts(7, num_queries=2, group_size=3, max_steps=2, max_calls=2,
                           max_gt_calls=2, max_params=2)
  b = random_call_rollouts(7, num_queries=2, group_size=3, max_steps=2, max_calls=2,
                           max_gt_calls=2, max_params=2)
  assert np.array_equal(np.asarray(a.call_sim), np.asarray(b.call_sim))
  with pytest.raises(ValueError, match="num_values"):
    random_call_rollouts(0, num_values=1)
