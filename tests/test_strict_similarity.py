"""The strict similarity (issue 51): HiDiffTIR's Eq. 22-25 with 0 for a call whose direction
parameters differ from the ground truth's, against the plain-Python reference."""

import jax
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tirjax.env.call_arrays import encode_row, stack_rows
from tirjax.env.toolworld.demos import flip
from tirjax.env.toolworld.queries import DIRECTION_PARAMS, DIRECTION_TOOLS
from tirjax.matching.encoding import CallEncoder, direction_slots
from tirjax.matching.similarity import call_similarity, strict_call_similarity
from tirjax.testing.reference.similarity import similarity, strict_similarity

T, K, C, P = 3, 2, 3, 3
DIRECTIONS = {"f": ("x",), "g": ("x", "y")}  # h has none
values = st.one_of(st.integers(-2, 2), st.sampled_from([1.0, "a", "b"]), st.booleans())
call = st.fixed_dictionaries({"name": st.sampled_from(["f", "g", "h"]), "arguments":
                              st.dictionaries(st.sampled_from("xyz"), values, max_size=P)})
episode = st.tuples(st.lists(st.lists(call, max_size=K), max_size=T), st.lists(call, max_size=C))


def _strict(rows, directions):
  """Plain and strict `call_sim` of `rows` ([(steps, gt calls)]), padded to 4 rows."""
  rows = rows + [([], [])] * (4 - len(rows))
  enc = CallEncoder()
  calls, call_valid, gt_valid, _ = stack_rows([
      encode_row(enc, steps, gt, max_steps=T, max_calls=K, max_gt_calls=C, max_params=P)
      for steps, gt in rows])
  mask = np.zeros((len(rows), C, P), bool)
  for b, (_, gt) in enumerate(rows):
    for c, g in enumerate(gt):
      mask[b, c] = direction_slots(g, P, directions)
  return (np.asarray(call_similarity(calls, call_valid, gt_valid)),
          np.asarray(strict_call_similarity(calls, call_valid, gt_valid, mask)))


@settings(max_examples=120, deadline=None)
@given(st.lists(episode, min_size=1, max_size=4))
def test_strict_call_sim_matches_reference(rows):
  plain, strict = _strict(rows, DIRECTIONS)
  assert np.isfinite(strict).all() and (strict <= plain + 1e-7).all()
  for b, (steps, gt) in enumerate(rows):
    want = np.zeros((T, K, C))
    for t, s in enumerate(steps):
      for k, c in enumerate(s):
        for g, gc in enumerate(gt):
          want[t, k, g] = strict_similarity(c, gc, DIRECTIONS)
    np.testing.assert_allclose(strict[b], want, atol=1e-6)


def test_a_flipped_direction_is_unmatched_only_when_strict():
  """On toolworld's direction tools, a flipped call keeps most of its plain similarity (the
  issue's near-match) and scores 0 when strict; the right call scores 1 either way, and a
  call of a tool without a direction is scored as before."""
  assert set(DIRECTION_PARAMS) == set(DIRECTION_TOOLS)
  gts = [{"name": "compare", "arguments": {"items": {"A": 1, "B": 2}, "mode": "max"}},
         {"name": "convert", "arguments": {"value": 3, "from_unit": "km", "to_unit": "mi"}},
         {"name": "city_info", "arguments": {"name": "A", "field": "temp_c"}}]
  other = {"name": "city_info", "arguments": {"name": "B", "field": "temp_c"}}
  steps = [[gts[0], flip(gts[0])], [gts[1], flip(gts[1])], [gts[2], other]]
  plain, strict = _strict([(steps, gts)], DIRECTION_PARAMS)
  for t in range(3):
    assert plain[0, t, 0, t] == strict[0, t, 0, t] == pytest.approx(1.0)
  for t in range(2):
    assert plain[0, t, 1, t] > 0.5 and strict[0, t, 1, t] == 0.0
  assert strict[0, 2, 1, 2] == plain[0, 2, 1, 2] == pytest.approx(similarity(other, gts[2]))


def test_direction_slots_follow_the_encoders_order_and_check_sizes():
  slots = direction_slots({"name": "convert", "arguments": {"value": 1, "to_unit": "f",
                                                            "from_unit": "c"}}, 4,
                          DIRECTION_PARAMS)
  np.testing.assert_array_equal(slots, [True, True, False, False])  # from, to, value, pad
  with pytest.raises(ValueError, match="max_params is 1"):
    direction_slots({"name": "f", "arguments": {"a": 1, "b": 2}}, 1, DIRECTIONS)
  calls, call_valid, gt_valid, _ = stack_rows([encode_row(
      CallEncoder(), [], [], max_steps=T, max_calls=K, max_gt_calls=C, max_params=P)])
  with pytest.raises(AssertionError, match="rank"):  # a mask without its parameter slots
    strict_call_similarity(calls, call_valid, gt_valid, np.zeros((1, C), bool))


def test_rollout_option_scores_the_episodes_calls_strictly(tokenizer):
  """`rollout.strict_directions` on episodes: confused demonstrations of knockout chains
  (each direction a coin flip) played through the runner; every pair's `call_sim` is the
  strict reference's with it on and the plain one's with it off, and some flipped compare is a
  near-match only when off. A task that names no direction parameters is refused."""
  import dataclasses  # pylint: disable=import-outside-toplevel
  from tirjax.env.toolworld import DemoOptions, Difficulty, make_demos, make_tasks
  from tirjax.episodes import RolloutOptions, Shapes, rollout
  from tirjax.testing.scripted_samplers import ScriptedSampler
  tasks = make_tasks("train", 8, seed=0, difficulty=Difficulty(
      chain_directions=2, chain_family="knockout", p_down=0.0))
  demos = make_demos(tasks, seed=0, options=DemoOptions(p_confuse=1.0))
  shapes = Shapes(num_rows=8, max_steps=6, max_calls=4, max_gt_calls=8, max_tokens=1024,
                  max_params=4)
  near = 0
  for strict in (False, True):
    opts = RolloutOptions(n=1, max_steps=6, max_new_tokens=160, shapes=shapes,
                          strict_directions=strict)
    batch = rollout(ScriptedSampler(tokenizer, tasks, demos), tokenizer, tasks, opts)
    sim = np.asarray(batch.rollouts.call_sim)
    for rec, task in zip(batch.episodes, tasks):
      gts = task.flat_gt_calls
      for t, result in enumerate(rec.results):
        for k, c in enumerate(result.calls):
          for g, gt in enumerate(gts):
            want = (strict_similarity(c, gt, DIRECTION_PARAMS) if strict
                    else similarity(c, gt))
            assert sim[rec.row, t, k, g] == pytest.approx(want, abs=1e-6)
            near += (not strict and c["name"] == "compare" and want > 0.5
                     and strict_similarity(c, gt, DIRECTION_PARAMS) == 0)
  assert near > 0
  bare = [dataclasses.replace(t, direction_params=None) for t in tasks]
  with pytest.raises(ValueError, match="rollout.strict_directions: task"):
    rollout(ScriptedSampler(tokenizer, bare, demos), tokenizer, bare, opts)
