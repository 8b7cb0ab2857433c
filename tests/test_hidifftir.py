"""hidifftir (spec §4.2) against the plain-Python reference, a worked group, and edge cases."""

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

from tirjax.rollouts import to_numpy
from tirjax.testing.call_batches import SHAPES, from_rows, random_batch, repad
from tirjax.testing.reference import REFERENCES
from tirjax import advantages
from tirjax.advantages.hidifftir import HiDiffTIROptions
from tirjax.segments import ZScore

EST = advantages.get("hidifftir")
REF = REFERENCES["hidifftir"]


def compare(r, opts, atol=2e-5):
  out = EST(r, opts)
  ref = REF(to_numpy(r), **{f: getattr(opts, f) for f in opts.__dataclass_fields__})
  np.testing.assert_allclose(np.asarray(out.steps), ref["steps"], atol=atol)
  np.testing.assert_allclose(np.asarray(out.rows), ref["rows"], atol=atol)
  assert np.all(np.isfinite(np.asarray(out.tokens)))
  return out


@hypothesis.given(seed=st.integers(0, 2**31 - 1), shape=st.sampled_from(sorted(SHAPES)))
def test_default_matches_reference(seed, shape):
  compare(random_batch(np.random.default_rng(seed), SHAPES[shape]), HiDiffTIROptions())


VARIANTS = [
    dict(answer_turn="none"),
    dict(success_rate="smoothed", lam=0.5, alpha=0.4),
    dict(trajectory_difficulty=False),
    dict(turn_difficulty=False),
    dict(zscore=ZScore(ddof=0, singleton="raw")),
]


@hypothesis.given(seed=st.integers(0, 2**31 - 1), variant=st.sampled_from(range(len(VARIANTS))))
@hypothesis.settings(max_examples=40)
def test_options_match_reference(seed, variant):
  r = random_batch(np.random.default_rng(seed), SHAPES["wide"])
  compare(r, HiDiffTIROptions(**VARIANTS[variant]))


@hypothesis.given(seed=st.integers(0, 2**31 - 1))
@hypothesis.settings(max_examples=30)
def test_greedy_matching_matches_reference_with_ties(seed):
  # The greedy matcher's tie rule is MatchTIR's, so kernel and reference agree even on ties.
  r = random_batch(np.random.default_rng(seed), SHAPES["wide"], ties=True)
  compare(r, HiDiffTIROptions(matching="greedy"))


def worked_group():
  """One query, two ground-truth calls c0, c1, three rows of two turns.

  row 0: turn 0 calls c0-like (0.8); turn 1 answers correctly (answer_score 1).
  row 1: turn 0 calls c0-like (0.5) and c1 exactly (1.0); turn 1 answers wrongly (0).
  row 2: turn 0 calls c0-like (0.3); turn 1 calls c1-like (0.4); never answers.
  """
  return from_rows([
      dict(group=0, steps=[[{0: 0.8}], []], answered=True, answer_score=1.0, outcome=1.0),
      dict(group=0, steps=[[{0: 0.5}, {1: 1.0}], []], answered=True, answer_score=0.0),
      dict(group=0, steps=[[{0: 0.3}], [{1: 0.4}]]),
  ], num_gt=2)


def test_worked_group():
  out = EST(worked_group())
  x = {k: np.asarray(v) for k, v in out.extras.items()}
  # Raw turn rewards (Eq. 3); the answering step takes answer_score.
  np.testing.assert_allclose(x["raw_reward"], [[0.8, 1.0], [0.75, 0.0], [0.3, 0.4]], atol=1e-6)
  # r̄(c0) = (0.8 + 0.5 + 0.3)/3 = 0.5333, r̄(c1) = (0 + 1 + 0.4)/3 = 0.4667; d = 1 − mean of
  # r̄ over the turn's matched ground truth (1 where it matched none).
  np.testing.assert_allclose(x["gt_mean_reward"][0], [1.6 / 3, 1.4 / 3], atol=1e-6)
  np.testing.assert_allclose(x["difficulty"], [[0.466667, 1.0], [0.5, 1.0], [0.466667, 0.533333]],
                             atol=1e-6)
  # Turn 0: r̃ = (0.37333, 0.375, 0.14), min-max → (0.99291, 1, 0), rescaled by
  # Σ r̃ / Σ r̂ = 0.88833 / 1.99291; turn 1: r̃ = (1, 0, 0.21333), min 0 and max 1 → unchanged.
  np.testing.assert_allclose(x["normalized"], [[0.442586, 1.0], [0.445747, 0.0], [0.0, 0.213333]],
                             atol=1e-5)
  np.testing.assert_allclose(np.asarray(out.row_reward), [1.442586, 0.445747, 0.213333],
                             atol=1e-5)
  np.testing.assert_allclose(np.asarray(out.rows), [1.136270, -0.390187, -0.746082], atol=1e-5)
  # Row 0 has A > 0: s(c0) = 3/(3 + 1) + 1 = 1.75, turn 1 matched nothing (s = 1), so
  # w̃ = (0.8/√1.75, 1.0) and ŵ = w̃ / mean w̃ = (0.753695, 1.246305). Rows 1, 2: ŵ = 1.
  np.testing.assert_allclose(x["turn_weight"], [[0.753695, 1.246305], [1, 1], [1, 1]], atol=1e-5)
  np.testing.assert_allclose(
      np.asarray(out.steps),
      [[1.052309, 1.220230], [-0.390187, -0.390187], [-0.746082, -0.746082]], atol=1e-5)
  # Tokens carry their step's advantage (one generated token per step).
  np.testing.assert_allclose(np.asarray(out.tokens)[0, [1, 3]], [1.052309, 1.220230], atol=1e-5)


@hypothesis.given(seed=st.integers(0, 2**31 - 1))
@hypothesis.settings(max_examples=20)
def test_alpha_one_is_the_trajectory_advantage(seed):
  r = random_batch(np.random.default_rng(seed), SHAPES["wide"])
  out = EST(r, HiDiffTIROptions(alpha=1.0))
  want = np.where(np.asarray(r.step_valid), np.asarray(out.rows)[:, None], 0.0)
  np.testing.assert_allclose(np.asarray(out.steps), want, atol=1e-6)


@hypothesis.given(seed=st.integers(0, 2**31 - 1))
@hypothesis.settings(max_examples=20)
def test_padding_invariance(seed):
  rng = np.random.default_rng(seed)
  r = random_batch(rng, SHAPES["square"])
  positions = rng.permutation(11)[:8]
  big = repad(r, (11, 4, 3, 7), positions)
  small, large = EST(r), EST(big)
  np.testing.assert_allclose(np.asarray(large.steps)[positions, :3], np.asarray(small.steps),
                             atol=1e-6)
  np.testing.assert_allclose(np.asarray(large.rows)[positions], np.asarray(small.rows), atol=1e-6)
  padding = np.setdiff1d(np.arange(11), positions)
  assert np.all(np.asarray(large.steps)[padding] == 0)
  assert np.all(np.asarray(large.tokens)[padding] == 0)


def test_degenerate_inputs_are_finite():
  shape = (4, 2, 2, 2)  # one padded shape: one compilation per option set
  cases = {
      "all padding": from_rows([], num_gt=0, shape=shape),
      "no ground truth": from_rows([dict(group=0, steps=[[{}], [{}, {}]]),
                                    dict(group=0, steps=[[]], answered=True, answer_score=1)],
                                   num_gt=0, shape=shape),
      "no calls": from_rows([dict(group=0, steps=[[], []]), dict(group=0, steps=[[]])],
                            num_gt=2, shape=shape),
      "singleton groups": from_rows([dict(group=0, steps=[[{0: 1.0}]]),
                                     dict(group=1, steps=[[{0: 0.5}]])], num_gt=1, shape=shape),
      "all equal": from_rows([dict(group=0, steps=[[{0: 0.5}], []], answered=True),
                              dict(group=0, steps=[[{0: 0.5}], []], answered=True)], num_gt=1,
                             shape=shape),
  }
  for name, r in cases.items():
    for opts in (HiDiffTIROptions(), HiDiffTIROptions(success_rate="smoothed", lam=1e-3)):
      out = EST(r, opts)
      for leaf in (out.tokens, out.steps, out.rows, *out.extras.values()):
        assert np.all(np.isfinite(np.asarray(leaf))), name
      if name != "no ground truth":
        assert np.all(np.asarray(out.steps) == 0), name  # one value per group: A = 0
    compare(r, HiDiffTIROptions())


@pytest.mark.parametrize("bad, match", [
    (dict(alpha=1.5), "alpha"), (dict(lam=0.0), "lam"), (dict(answer_turn="last"), "answer_turn"),
    (dict(success_rate="x"), "success_rate"), (dict(matching="auction"), "matching"),
    (dict(turn_difficulty=1), "turn_difficulty")])
def test_invalid_options_are_named(bad, match):
  with pytest.raises(ValueError, match=match):
    HiDiffTIROptions(**bad)


def test_formula_functions_check_ranks_and_dtypes():
  from tirjax.advantages import hidifftir as h
  x = np.zeros((4, 3), np.float32)
  mask = np.ones((4, 3), bool)
  with pytest.raises(AssertionError, match="rank"):
    h.turn_weights(x, x, x, mask)  # the advantage is one per row, [B]
  with pytest.raises(AssertionError, match="type"):
    h.turn_weights(x, x, x[:, 0], x)  # the step mask is boolean
  with pytest.raises(AssertionError, match="type"):
    h.difficulty_per_turn(x, x, 3)  # ground-truth turn indices are integers
  h.turn_weights(x, x, x[:, 0], mask)
