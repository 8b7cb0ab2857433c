"""pass@k and the sampled-evaluation shares (the headroom measures of the trainer's and
`experiments.evaluate`'s evaluations) against an enumeration of every k-subset of the samples."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, strategies as st
from scipy import special

from tirjax.env.toolworld import Difficulty, make_tasks
from tirjax.episodes import RolloutOptions, Shapes
from tirjax.testing.scripted_samplers import GuessSampler, distinct_questions
from tirjax.trainer.evaluation import evaluate, pass_at_k, sampled_metrics


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


@pytest.fixture(scope="module")
def answerable():
  """Toolworld tasks with an answer (no tool down), distinct questions."""
  tasks = make_tasks("eval", 48, seed=5, difficulty=Difficulty(p_down=0.0))
  return distinct_questions(tasks, 16)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_sampled_evaluation_samples_at_the_rollout_temperature(tokenizer, answerable,
                                                              temperature):
  """Issue 42: `evaluate`'s pass@k samples at the rollout temperature, not the greedy
  evaluation's. The policy answers right with probability p_T = 0.3 at T = 1 (0.155 at
  T = 0.5) and greedily wrong: the greedy episodes are all wrong, the samples of a task
  differ, pass@1 is p_T (within 4 standard errors of the 128 samples) and pass@8 is well
  above it (1 − (1 − p_T)^8 in expectation: 0.94, 0.74)."""
  n = 8
  sampler = GuessSampler(tokenizer, answerable, p_right=0.3)
  options = RolloutOptions(mode="independent", n=2, temperature=temperature, max_steps=1,
                           max_new_tokens=64, shapes=Shapes(num_rows=32, max_steps=1,
                                                            max_tokens=512))
  m = evaluate(sampler, tokenizer, answerable, options, temperature=0.0, samples=n)
  p = sampler.p_at(temperature)
  assert p == pytest.approx(special.softmax(np.log([0.3, 0.7]) / temperature)[0])
  assert m["eval/accuracy"] == 0.0  # greedy: the likelier answer, the wrong one
  assert m["eval/sampled_mixed"] > 0.5  # most tasks' samples hold right and wrong answers
  assert abs(m["eval/pass@1"] - p) < 4 * math.sqrt(p * (1 - p) / (n * len(answerable)))
  assert m["eval/pass@1"] == m["eval/sampled_accuracy"]
  assert m["eval/pass@1"] <= m["eval/pass@4"] <= m["eval/pass@8"]
  assert m["eval/pass@8"] - m["eval/pass@1"] > 0.4
  assert m["eval/sampled_temperature"] == temperature
  assert [c.temperature for c in sampler.calls if c.n == n] == [temperature] * 4
