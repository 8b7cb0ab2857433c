"""Issue 51's toy model (`tirjax.credit.toy_signal`) against a brute-force enumeration."""

import json

import hypothesis
import hypothesis.strategies as st
import pytest

from tirjax.credit import toy_signal
from tirjax.testing.reference import toy_signal as ref

SMALL = st.sampled_from([(1, 2), (1, 5), (2, 2), (2, 3), (2, 4), (3, 3), (4, 2), (3, 4)])
PROBS = st.one_of(st.sampled_from([0.0, 1.0, 0.5]), st.floats(0.0, 1.0))


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(SMALL, PROBS, st.sampled_from(toy_signal.CREDITS))
def test_signal_matches_brute_force(kg, p, credit):
  k, g = kg
  got = toy_signal.signal(credit, k, p, g)
  assert got == pytest.approx(ref.signal(credit, k, p, g), abs=1e-10)
  assert got >= -1e-12  # every credit pushes towards the right decision on average
  assert toy_signal.all_fail_share(k, p, g) == pytest.approx(ref.all_fail_share(k, p, g),
                                                             abs=1e-12)


def test_degenerate_policies_carry_no_signal_and_bad_input_is_named():
  for credit in toy_signal.CREDITS:
    for p in (0.0, 1.0):  # every row alike: every advantage 0
      assert toy_signal.signal(credit, 3, p, 5) == 0.0
  with pytest.raises(ValueError, match="credit: must be one of"):
    toy_signal.signal("turn", 2, 0.5, 4)
  with pytest.raises(ValueError, match="g: need an integer >= 2"):
    toy_signal.signal("dense", 2, 0.5, 1)
  with pytest.raises(ValueError, match="p: need a probability"):
    toy_signal.all_fail_share(2, 1.5, 4)
  with pytest.raises(ValueError, match="k: need an integer >= 1"):
    toy_signal.signal("outcome", 0, 0.5, 4)


def test_the_gap_grows_with_k_and_the_committed_file_recomputes():
  """The dose-response the testbed relies on: at p = 0.5, G = 12, both dense and oracle credit
  gain on outcome credit from K = 2 to K = 4; and the committed results file is what the
  module computes now."""
  t = toy_signal.table()
  for credit in ("dense", "oracle"):
    assert (t["k"]["4"]["ratio_to_outcome"][credit]
            > t["k"]["2"]["ratio_to_outcome"][credit] > 1)
  with open("benchmarks/results/credit_toy_signal.json") as f:
    committed = json.load(f)
  assert committed["k"] == json.loads(json.dumps(t["k"]))
  assert (committed["p"], committed["g"]) == (t["p"], t["g"])
