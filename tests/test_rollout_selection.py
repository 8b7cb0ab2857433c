"""The pure selection rules of the rollout modes against `tirjax/testing/reference/rollout_selection.py`."""

import math

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

from tirjax.testing.reference import rollout_selection as ref
from tirjax.episodes import selection
from tirjax.episodes.options import ArpoOptions

SIGMAS = 5.0  # tolerance of frequency checks, in binomial standard deviations


def _close_to(freq: float, p: float, draws: int) -> bool:
  return abs(freq - p) <= SIGMAS * math.sqrt(max(p * (1 - p), 1e-12) / draws) + 1e-12


# -- PORTool Algorithm 1: n − n_c of all candidates, uniformly without replacement -----------


@hypothesis.given(st.integers(1, 40), st.data(), st.integers(0, 2**32 - 1))
def test_tree_select_keeps_exactly_the_requested_distinct_candidates(n_cand, data, seed):
  keep = data.draw(st.integers(0, n_cand))
  chosen = selection.tree_select(n_cand, keep, np.random.default_rng(seed))
  assert len(chosen) == keep == len(set(chosen.tolist()))
  assert np.all(np.diff(chosen) > 0) and np.all((chosen >= 0) & (chosen < n_cand))


@pytest.mark.parametrize("n_cand,keep", [(16, 8), (12, 5), (6, 1), (7, 7)])
def test_tree_select_is_uniform_without_replacement(n_cand, keep):
  draws = 20_000
  rng = np.random.default_rng(0)
  hits = np.zeros(n_cand)
  pair = 0
  for _ in range(draws):
    chosen = selection.tree_select(n_cand, keep, rng)
    hits[chosen] += 1
    pair += (0 in chosen) and (n_cand - 1 in chosen)
  p = ref.inclusion_probability(n_cand, keep)
  assert all(_close_to(h / draws, p, draws) for h in hits), hits / draws
  assert _close_to(pair / draws, ref.pair_inclusion_probability(n_cand, keep), draws)


@pytest.mark.parametrize("n_cand,keep", [(4, 5), (3, -1)])
def test_tree_select_rejects_an_impossible_count(n_cand, keep):
  with pytest.raises(ValueError, match="num_keep"):
    selection.tree_select(n_cand, keep, np.random.default_rng(0))


# -- ARPO: entropy of the first k tokens, and the branching rule ------------------------------

logits_strategy = st.lists(st.floats(-20, 20), min_size=2, max_size=12)


@hypothesis.given(st.lists(logits_strategy, min_size=1, max_size=25), st.integers(1, 30),
                  st.integers(2, 200_000))
def test_step_entropy_from_full_entropies_matches_the_reference(logits, k, vocab):
  entropies = [ref.entropy_of_logits(x) for x in logits]
  got = selection.step_entropy(entropies, None, len(logits), k, vocab)
  assert got == pytest.approx(ref.step_entropy_from_logits(logits, k, vocab), abs=1e-9)
  assert math.isfinite(got) and got >= 0


top_strategy = st.dictionaries(st.integers(0, 1000), st.floats(-30, 0), min_size=1, max_size=10)


@hypothesis.given(st.lists(top_strategy, min_size=1, max_size=25), st.integers(1, 30),
                  st.integers(2, 200_000))
def test_step_entropy_from_top_logprobs_matches_the_reference(tops, k, vocab):
  got = selection.step_entropy(None, tops, len(tops), k, vocab)
  assert got == pytest.approx(ref.step_entropy_from_top(tops, k, vocab), abs=1e-9)


def test_step_entropy_prefers_full_entropies_and_needs_one_source():
  assert selection.step_entropy([1.0, 2.0], [{0: 0.0}, {0: 0.0}], 2, 20, 3) == pytest.approx(
      3.0 / math.log(3))
  with pytest.raises(ValueError, match="neither entropies nor top log-probs"):
    selection.step_entropy(None, None, 3, 20, 100)
  assert selection.step_entropy([], None, 0, 20, 100) == 0.0  # an empty step


@pytest.mark.parametrize("delta,tau,w", [(0.0, 0.5, 0.2), (1.5, 0.5, 0.2), (-1.0, 0.5, 0.2),
                                         (3.0, 0.3, 0.5), (-0.4, 0.8, 1.0), (0.7, 0.0, 0.0),
                                         (-5.0, 1.0, 0.2)])
def test_branch_probability_is_clip_tau_plus_w_delta(delta, tau, w):
  opts = ArpoOptions(branch_probability=tau, entropy_weight=w)
  draws = 20_000
  made = selection.branch_count(delta, draws, opts, np.random.default_rng(1))
  assert _close_to(made / draws, ref.branch_probability(delta, tau, w), draws)


@hypothesis.given(st.lists(st.floats(-3, 3), max_size=12), st.integers(-2, 20),
                  st.integers(2, 5), st.floats(0, 1), st.floats(0, 2),
                  st.integers(0, 2**32 - 1))
def test_arpo_branches_respect_beam_and_budget(deltas, slots, beam, tau, w, seed):
  opts = ArpoOptions(beam_size=beam, branch_probability=tau, entropy_weight=w)
  copies = selection.arpo_branches(deltas, slots, opts, np.random.default_rng(seed))
  assert len(copies) == len(deltas)
  assert all(0 <= c <= beam - 1 for c in copies)
  assert sum(copies) <= max(slots, 0)


@hypothesis.given(st.lists(st.floats(0.5, 3), min_size=1, max_size=12), st.integers(0, 20),
                  st.integers(2, 5))
def test_rising_entropy_with_a_large_weight_branches_greedily_until_the_budget(deltas, slots,
                                                                                beam):
  opts = ArpoOptions(beam_size=beam, entropy_weight=1e3)
  copies = selection.arpo_branches(deltas, slots, opts, np.random.default_rng(0))
  want, left = [], slots
  for _ in deltas:
    want.append(min(beam - 1, left))
    left -= want[-1]
  assert copies == want


@hypothesis.given(st.lists(st.floats(-3, -0.5), min_size=1, max_size=12), st.integers(0, 20))
def test_falling_entropy_with_a_large_weight_never_branches(deltas, slots):
  opts = ArpoOptions(entropy_weight=1e3)
  assert selection.arpo_branches(deltas, slots, opts, np.random.default_rng(0)) == [0] * len(
      deltas)
