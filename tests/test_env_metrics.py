"""Metrics (spec §6) against references written from the papers."""

import pytest
from hypothesis import given, strategies as st

from tirjax.testing.reference import env_metrics as ref
from tirjax.env import metrics
from tirjax.env.executor import EpisodeSummary


@st.composite
def counts(draw):
  n_gen, n_gt = draw(st.integers(0, 12)), draw(st.integers(1, 12))
  return draw(st.integers(0, min(n_gen, n_gt))), n_gen, n_gt


@given(counts())
def test_solve_scores_match_paper(c):
  got = metrics.solve_scores(*c)
  want = ref.solve(*c)
  assert got[0] == pytest.approx(want[0]) and got[1] == pytest.approx(want[1])
  if c[1] > 0:  # Eq. 20 equals the harmonic mean of P and R whenever N_gen > 0
    assert got[2] == pytest.approx(want[2])
  assert all(0 <= x <= 1 for x in got)


def test_solve_scores_edge_cases():
  assert metrics.solve_scores(0, 0, 3) == (1.0, 0.0, 0.0)  # Eq. 18: no calls → P = 1
  with pytest.raises(ValueError, match="n_gt"):
    metrics.solve_scores(0, 1, 0)
  with pytest.raises(ValueError, match="n_match"):
    metrics.solve_scores(3, 2, 5)


@st.composite
def episodes(draw):
  n = draw(st.integers(1, 12))
  out, outcomes = [], []
  for _ in range(n):
    steps = draw(st.integers(0, 6))
    answered = steps > 0 and draw(st.booleans())
    fm = tuple(draw(st.sampled_from([-0.25, -0.15, -0.05, 0.05, 0.15, 0.25]))
               for _ in range(steps))
    n_exp = draw(st.integers(1, 4))
    n_calls = draw(st.integers(0, 8))
    out.append(EpisodeSummary(
        task_id=draw(st.sampled_from("abcd")), num_steps=steps, answered=answered,
        answer=draw(st.sampled_from(["x", "unable_to_answer", "I cannot answer."]))
        if answered else None, format_rewards=fm, num_calls=n_calls,
        num_solved=draw(st.integers(0, min(n_calls, n_exp))), num_expected=n_exp))
    outcomes.append(draw(st.sampled_from([1.0, 0.0, -1.0])) if answered else -1.0)
  return out, outcomes


@given(episodes())
def test_portool_and_solve_metrics_match_reference(data):
  eps, outcomes = data
  got = metrics.portool_metrics(eps, outcomes, step_cap=5)
  assert got["accuracy"] == pytest.approx(
      ref.per_query_mean([(e.task_id, o == 1) for e, o in zip(eps, outcomes)]))
  assert got["avg_tool_steps"] == pytest.approx(
      ref.per_query_mean([(e.task_id, min(e.num_steps, 5)) for e in eps]))
  assert got["unanswerable_rate"] == pytest.approx(
      ref.per_query_mean([(e.task_id, not e.answered) for e in eps]))
  assert got["abstain_rate"] == pytest.approx(
      ref.per_query_mean([(e.task_id, e.answered and e.answer != "x") for e in eps]))
  stepped = [(e.task_id, sum(e.format_rewards) / len(e.format_rewards)) for e in eps
             if e.format_rewards]
  assert got["avg_format_reward"] == pytest.approx(ref.per_query_mean(stepped) if stepped else 0)
  solve = metrics.solve_metrics(eps)
  for i, name in enumerate(("solve_p", "solve_r", "solve_f1")):
    assert solve[name] == pytest.approx(ref.per_query_mean(
        [(e.task_id, metrics.solve_scores(e.num_solved, e.num_calls, e.num_expected)[i])
         for e in eps]))


def test_answer_correctness_is_containment():
  assert metrics.answer_correctness("The answer is John Smith.", "John Smith") == 1.0
  assert metrics.answer_correctness("It was 1,962.", "1962") == 1.0  # commas ignored
  assert metrics.answer_correctness("Smith, John", "John Smith") == 0.0
  assert metrics.answer_correctness(None, "x") == 0.0
  # FTRL's scorer's option: an answer that misses it is still correct when the tool response
  # just before it contains the gold; an empty answer never is.
  tool = '[{"name": "lookup", "result": "born in 1962"}]'
  assert metrics.answer_correctness("I could not tell.", "1962") == 0.0
  assert metrics.answer_correctness("I could not tell.", "1962", tool_message=tool) == 1.0
  assert metrics.answer_correctness("", "1962", tool_message=tool) == 0.0
  assert metrics.answer_correctness("I could not tell.", "1963", tool_message=tool) == 0.0


def test_metrics_reject_bad_input():
  with pytest.raises(ValueError, match="lengths differ"):
    metrics.portool_metrics([], [1.0])
  with pytest.raises(ValueError, match="at least one episode"):
    metrics.query_mean([], [])
