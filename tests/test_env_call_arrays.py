"""Episode call arrays → `CallEncoding` and `call_sim` (spec §2), against the reference of
HiDiffTIR Eq. 22-25."""

import jax
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tirjax.testing.reference import env_calls as ref
from tirjax.env.call_arrays import encode_row, stack_rows
from tirjax.matching.encoding import CallEncoder
from tirjax.matching.similarity import call_similarity

T, K, C, P = 4, 3, 4, 3
SIM = jax.jit(call_similarity)
values = st.one_of(st.integers(-3, 3), st.sampled_from([1.0, 2.5]), st.sampled_from("ab"),
                   st.booleans(), st.lists(st.integers(0, 2), max_size=2))
call = st.fixed_dictionaries({"name": st.sampled_from(["f", "g", "h"]), "arguments":
                              st.dictionaries(st.sampled_from("xyz"), values, max_size=P)})
episode = st.tuples(st.lists(st.lists(call, max_size=K), max_size=T),
                    st.lists(call, max_size=C))


@settings(max_examples=120)
@given(st.lists(episode, min_size=1, max_size=4))
def test_call_sim_matches_reference(rows):
  rows = rows + [([], [])] * (4 - len(rows))  # one padded shape: compiled once
  enc = CallEncoder()
  encoded = [encode_row(enc, steps, gt, max_steps=T, max_calls=K, max_gt_calls=C, max_params=P,
                        step_solves=[[i % 2 == 0 for i in range(len(s))] for s in steps])
             for steps, gt in rows]
  calls, call_valid, gt_valid, solves = stack_rows(encoded)
  sim = np.asarray(SIM(calls, call_valid, gt_valid))
  assert sim.shape == (4, T, K, C)
  for b, (steps, gt) in enumerate(rows):
    want = np.zeros((T, K, C))
    for t, s in enumerate(steps):
      for k, c in enumerate(s):
        for g, gc in enumerate(gt):
          want[t, k, g] = ref.similarity(c, gc)
        assert bool(solves[b, t, k]) == (k % 2 == 0)
    np.testing.assert_allclose(sim[b], want, atol=1e-6)
    assert int(np.asarray(call_valid[b]).sum()) == sum(len(s) for s in steps)
    assert int(np.asarray(gt_valid[b]).sum()) == len(gt)


def test_overflow_names_the_size():
  enc = CallEncoder()
  c = {"name": "f", "arguments": {}}
  with pytest.raises(ValueError, match="max_calls=1 is too small"):
    encode_row(enc, [[c, c]], [], max_steps=2, max_calls=1, max_gt_calls=1, max_params=1)
  with pytest.raises(ValueError, match="max_steps=1 is too small"):
    encode_row(enc, [[c], [c]], [], max_steps=1, max_calls=1, max_gt_calls=1, max_params=1)
  with pytest.raises(ValueError, match="max_gt_calls=0 is too small"):
    encode_row(enc, [], [c], max_steps=1, max_calls=1, max_gt_calls=0, max_params=1)
  with pytest.raises(ValueError, match="max_params"):
    encode_row(enc, [[{"name": "f", "arguments": {"a": 1, "b": 2}}]], [], max_steps=1,
               max_calls=1, max_gt_calls=1, max_params=1)
