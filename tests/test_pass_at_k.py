"""pass@k and the sampled-evaluation shares (the headroom measures of the trainer's and
`experiments.evaluate`'s evaluations) against an enumeration of every k-subset of the samples."""

import itertools

import numpy as np
import pytest
from hypothesis import given, strategies as st

from tirjax.trainer.evaluation import pass_at_k, sampled_metrics


def pass_at_k_by_enumeration(outcomes, k):
  """The share of the k-subsets of a task's samples that hold a correct one (the definition
  Chen et al. 2021's estimator is unbiased for)."""
  subsets = list(itertools.combinations(outcomes, k))
  return sum(any(s) for s in subsets) / len(subsets)


@given(st.lists(st.booleans(), min_size=1, max_size=9), st.data())
def test_pass_at_k_equals_the_share_of_k_subsets_with_a_right_sample(outcomes, data):
  k = data.draw(st.integers(1, len(outcomes)))
  assert pass_at_k(len(outcomes), sum(outcomes), k) == pytest.approx(
      pass_at_k_by_enumeration(outcomes, k), abs=1e-12)


@given(st.lists(st.lists(st.booleans(), min_size=4, max_size=4), min_size=1, max_size=12))
def test_sampled_metrics(correct):
  m = sampled_metrics(correct, ks=(1, 2, 16))
  assert set(m) == {"eval/pass@1", "eval/pass@2", "eval/pass@4", "eval/sampled_all_wrong",
                    "eval/sampled_mixed", "eval/sampled_all_right"}  # 16 > 4 samples: left out
  assert m["eval/pass@1"] == pytest.approx(np.mean(correct))  # pass@1: the mean accuracy
  assert m["eval/pass@4"] == pytest.approx(np.mean([any(c) for c in correct]))
  assert m["eval/pass@1"] <= m["eval/pass@2"] <= m["eval/pass@4"]
  assert m["eval/sampled_all_wrong"] == pytest.approx(np.mean([not any(c) for c in correct]))
  assert m["eval/sampled_all_right"] == pytest.approx(np.mean([all(c) for c in correct]))
  assert (m["eval/sampled_all_wrong"] + m["eval/sampled_mixed"] + m["eval/sampled_all_right"]
          == pytest.approx(1.0))


def test_errors_name_the_problem():
  with pytest.raises(ValueError, match="1 <= k <= n"):
    pass_at_k(4, 1, 5)
  with pytest.raises(ValueError, match="0 <= c <= n"):
    pass_at_k(4, 5, 1)
  with pytest.raises(ValueError, match="the same number"):
    sampled_metrics([[True], [True, False]])
