"""Matching kernels against references: exact (scipy), greedy (MatchTIR's sort), Sinkhorn (POT)."""

import functools

import hypothesis
import hypothesis.strategies as st
import jax
import numpy as np
import pytest

from tirjax.testing.reference.matching import exact_matching, greedy_matching, sinkhorn_knopp
from tirjax.matching.chunks import CHUNK
from tirjax.matching.greedy import greedy_matching as greedy_kernel
from tirjax.matching.hungarian import matched_weights, max_weight_matching
from tirjax.matching.sinkhorn import ot_call_rewards, sinkhorn_plan, solve_spd

N = 6
SHAPES = [(5, 3), (3, 5), (4, 4), (1, 6), (6, 1)]  # (m, n): m > n, m < n, square, extremes
exact_jit = jax.jit(max_weight_matching)
greedy_jit = jax.jit(greedy_kernel)
# Converged far past the default stopping rule, so that both sides reach the same plan.
plan_jit = jax.jit(functools.partial(sinkhorn_plan, max_iter=20000, tol=1e-7))


def draw_weights(seed, m, n, kind):
  rng = np.random.default_rng(seed)
  if kind == "continuous":
    w = rng.uniform(0.01, 1.0, size=(N, m, n))
  elif kind == "ties":
    w = rng.integers(0, 4, size=(N, m, n)) / 3.0
  else:  # "negative": weights ≤ 0 count as unmatched
    w = rng.uniform(-1.0, 1.0, size=(N, m, n))
  w = np.where(rng.random((N, m, n)) < 0.3, 0.0, w).astype(np.float32)
  row_valid = rng.random((N, m)) < 0.8
  col_valid = rng.random((N, n)) < 0.8
  row_valid[0] = False  # one all-padding instance
  return w, row_valid, col_valid


def valid_submatrix(w, row_valid, col_valid, b):
  return np.maximum(w[b][row_valid[b]][:, col_valid[b]], 0.0).astype(np.float64)


def check_matching(m, w, row_valid, col_valid):
  """One-to-one, consistent both ways, only valid pairs of positive weight."""
  r2c, c2r = np.asarray(m.row_to_col), np.asarray(m.col_to_row)
  for b in range(w.shape[0]):
    for i, j in enumerate(r2c[b]):
      if j >= 0:
        assert c2r[b, j] == i and row_valid[b, i] and col_valid[b, j] and w[b, i, j] > 0
    for j, i in enumerate(c2r[b]):
      if i >= 0:
        assert r2c[b, i] == j


@hypothesis.given(seed=st.integers(0, 2**31 - 1), shape=st.sampled_from(SHAPES),
                  kind=st.sampled_from(["continuous", "ties", "negative"]))
def test_exact_matching_is_optimal(seed, shape, kind):
  w, rv, cv = draw_weights(seed, *shape, kind)
  m = exact_jit(w, rv, cv)
  check_matching(m, w, rv, cv)
  per_row, per_col = matched_weights(w, m)
  got = np.asarray(per_row).sum(axis=1)
  np.testing.assert_allclose(np.asarray(per_col).sum(axis=1), got, rtol=1e-6)
  r2c = np.asarray(m.row_to_col)
  for b in range(N):
    sub = valid_submatrix(w, rv, cv, b)
    want = sum(sub[i, j] for i, j in exact_matching(sub))
    assert got[b] == pytest.approx(want, abs=1e-5)
    # spec §4.2's tie rule: the very matching of the reference, ties included.
    rows, cols = np.flatnonzero(rv[b]), np.flatnonzero(cv[b])
    assert {(i, j) for i, j in enumerate(r2c[b]) if j >= 0} == {
        (rows[i], cols[j]) for i, j in exact_matching(sub)}


@hypothesis.given(seed=st.integers(0, 2**31 - 1), shape=st.sampled_from(SHAPES),
                  kind=st.sampled_from(["continuous", "ties", "negative"]))
def test_greedy_matching_equals_matchtir_sort(seed, shape, kind):
  w, rv, cv = draw_weights(seed, *shape, kind)
  m = greedy_jit(w, rv, cv)
  check_matching(m, w, rv, cv)
  r2c = np.asarray(m.row_to_col)
  for b in range(N):
    rows, cols = np.flatnonzero(rv[b]), np.flatnonzero(cv[b])
    want = {(rows[i], cols[j]) for i, j in greedy_matching(valid_submatrix(w, rv, cv, b))}
    assert {(i, j) for i, j in enumerate(r2c[b]) if j >= 0} == want
    # MatchTIR's row-major tie order gives spec §4.2's ground-truth-first matching.
    want_gt_first = {(rows[i], cols[j]) for i, j in
                     greedy_matching(valid_submatrix(w, rv, cv, b), gt_first=True)}
    assert want_gt_first == want


def test_greedy_and_exact_disagree():
  # Greedy takes the single best pair (0, 0) = 1.0 and then nothing is left above 0 for row 1;
  # the exact matching takes (0, 1) + (1, 0) = 0.9 + 0.8.
  w = np.array([[[1.0, 0.9], [0.8, 0.0]]], np.float32)
  greedy, exact = greedy_kernel(w), max_weight_matching(w)
  assert np.asarray(greedy.row_to_col).tolist() == [[0, -1]]
  assert np.asarray(exact.row_to_col).tolist() == [[1, 0]]
  assert float(matched_weights(w, exact)[0].sum()) == pytest.approx(1.7)


def test_greedy_ties_go_to_the_first_pair_in_row_major_order():
  """(MatchTIR's order; on every tie it picks the matching spec §4.2's GT-first order does.)"""
  w = np.array([[[0.5, 0.5], [0.5, 0.5], [0.5, 0.0]]], np.float32)
  m = greedy_kernel(w)
  assert np.asarray(m.row_to_col).tolist() == [[0, 1, -1]]


@pytest.mark.parametrize("w, want", [
    # Two equal optima: GT 0 takes predicted 0 (the earliest), so GT 1 gets predicted 1.
    ([[1.0, 1.0], [1.0, 1.0]], [0, 1]),
    # GT 0 may take predicted 1 or 2 at no cost to the optimum (2.0): the earliest, 1.
    ([[0.0, 1.0], [1.0, 0.5], [1.0, 0.5]], [1, 0]),
    # Duplicate predicted calls (steps 0 and 2) for one GT call: the earlier one.
    ([[0.8], [0.3], [0.8]], [0]),
    # Optimum 1.5 either as (0→GT0, 1→GT1) or (1→GT0, 0→GT1)... GT 0 gets predicted 0.
    ([[1.0, 0.5], [0.5, 1.0]], [0, 1]),
    # Unmatched ranks last: GT 0 matched (to 1) rather than left out for GT 1's sake.
    ([[0.0, 0.7], [0.7, 0.0]], [1, 0]),
    # More GT calls than predicted ones: the earliest GT call that can be matched optimally.
    ([[0.5, 0.5, 0.5]], [0, -1, -1]),
])
def test_exact_ties_go_to_the_earliest_predicted_call(w, want):
  """spec §4.2: among optimal matchings, each GT call in order takes the earliest predicted
  call it can (the lexicographically smallest vector of matched positions)."""
  w = np.array([w], np.float32)
  m = max_weight_matching(w)
  assert np.asarray(m.col_to_row).tolist() == [want]
  ref_c2r = [-1] * w.shape[2]
  for i, j in exact_matching(w[0]):
    ref_c2r[j] = i
  assert ref_c2r == want


def test_degenerate_shapes():
  for m_, n_ in [(0, 3), (3, 0), (0, 0)]:
    w = np.zeros((2, m_, n_), np.float32)
    for fn in (max_weight_matching, greedy_kernel):
      m = fn(w)
      assert m.row_to_col.shape == (2, m_) and m.col_to_row.shape == (2, n_)
  m = max_weight_matching(np.zeros((3, 4, 2), np.float32))
  assert np.all(np.asarray(m.row_to_col) == -1) and np.all(np.asarray(m.col_to_row) == -1)


@hypothesis.given(seed=st.integers(0, 2**31 - 1), shape=st.sampled_from(SHAPES))
@hypothesis.settings(max_examples=25)
def test_sinkhorn_plan_matches_pot_loop(seed, shape):
  rng = np.random.default_rng(seed)
  m_, n_ = shape
  sim = np.where(rng.random((N, m_, n_)) < 0.3, 0.0,
                 rng.uniform(0.0, 1.0, size=(N, m_, n_))).astype(np.float32)
  rv, cv = rng.random((N, m_)) < 0.8, rng.random((N, n_)) < 0.8
  rv[0] = False
  plan = np.asarray(plan_jit(sim, rv, cv))
  assert np.all(np.isfinite(plan))
  for b in range(N):
    assert np.all(plan[b][~rv[b]] == 0) and np.all(plan[b][:, ~cv[b]] == 0)
    S = sim[b][rv[b]][:, cv[b]].astype(np.float64)
    if S.size == 0:
      assert np.all(plan[b] == 0)
      continue
    P, C = S.shape
    want = sinkhorn_knopp(np.full(P, 1 / P), np.full(C, 1 / C), S, 0.1, num_iter_max=20000,
                          stop_thr=1e-10)
    np.testing.assert_allclose(plan[b][rv[b]][:, cv[b]], want, atol=2e-6)


def test_ot_rewards_scale_like_matchtir():
  # One exact pair among P = 2 calls and C = 1 ground-truth call: rewards are Σ_v T_uv S_uv.
  sim = np.array([[[1.0], [0.0]]], np.float32)
  got = np.asarray(ot_call_rewards(sim))[0]
  plan = sinkhorn_knopp(np.full(2, 0.5), np.ones(1), sim[0].astype(np.float64), 0.1)
  np.testing.assert_allclose(got, (plan * sim[0]).sum(axis=1), atol=1e-6)
  assert got[0] == pytest.approx(0.5, abs=1e-6)  # marginal 1/P caps a call's reward at S/P


@pytest.mark.parametrize("reg", [1.0, 0.05, 0.01])
def test_sinkhorn_finite_for_small_reg(reg):
  rng = np.random.default_rng(0)
  sim = np.where(rng.random((16, 6, 3)) < 0.5, 0.0, rng.random((16, 6, 3))).astype(np.float32)
  plan = np.asarray(sinkhorn_plan(sim, reg=reg))
  assert np.all(np.isfinite(plan))
  np.testing.assert_allclose(plan.sum(axis=(1, 2)), 1.0, atol=1e-4)


def test_batches_spanning_several_chunks():
  # 2 full chunks and a padded third: every problem is solved as it would be alone.
  rng = np.random.default_rng(1)
  count = 2 * CHUNK + 7
  w = np.where(rng.random((count, 5, 3)) < 0.3, 0.0,
               rng.integers(1, 5, size=(count, 5, 3)) / 4).astype(np.float32)
  rv, cv = rng.random((count, 5)) < 0.8, rng.random((count, 3)) < 0.9
  exact, greedy = exact_jit(w, rv, cv), greedy_jit(w, rv, cv)
  check_matching(exact, w, rv, cv)
  got = np.asarray(matched_weights(w, exact)[0]).sum(axis=1)
  r2c = np.asarray(greedy.row_to_col)
  for b in range(count):
    sub = valid_submatrix(w, rv, cv, b)
    assert got[b] == pytest.approx(sum(sub[i, j] for i, j in exact_matching(sub)), abs=1e-5)
    rows, cols = np.flatnonzero(rv[b]), np.flatnonzero(cv[b])
    assert {(i, j) for i, j in enumerate(r2c[b]) if j >= 0} == {
        (rows[i], cols[j]) for i, j in greedy_matching(sub)}
  alone = np.asarray(plan_jit(w[-3:], rv[-3:], cv[-3:]))
  np.testing.assert_allclose(np.asarray(plan_jit(w, rv, cv))[-3:], alone, atol=1e-6)


def test_non_finite_weights_count_as_unmatched_and_return():
  """A NaN or infinite similarity once made the search loop forever (issue 14): both
  matchers treat it as weight 0."""
  w = np.array([[[np.nan, 0.5], [0.7, np.inf]], [[-np.inf, np.nan], [np.nan, 0.2]]], np.float32)
  for fn in (max_weight_matching, greedy_kernel):
    m = fn(w)
    assert np.asarray(m.row_to_col).tolist() == [[1, 0], [-1, 1]], fn.__name__


def test_solve_spd_matches_numpy():
  rng = np.random.default_rng(3)
  x = rng.normal(size=(64, 8, 12))
  a = x @ np.swapaxes(x, 1, 2) / 12 + np.geomspace(1e-4, 1.0, 64)[:, None, None] * np.eye(8)
  b = rng.normal(size=(64, 8))
  got = np.asarray(jax.jit(solve_spd)(a.astype(np.float32), b.astype(np.float32)))
  want = np.linalg.solve(a, b[:, :, None])[:, :, 0]
  np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3 * np.abs(want).max())


@pytest.mark.slow
@pytest.mark.parametrize("reg", [0.1, 0.03])
def test_sinkhorn_tail_is_solved_to_pot_convergence(reg):
  """A batch large enough that its unconverged tail is gathered over several passes (ties and
  near-sparse plans make the slow problems): every problem reaches POT's converged plan."""
  rng = np.random.default_rng(7)
  count, m_, n_ = 300, 12, 5
  sim = np.where(rng.random((count, m_, n_)) < 0.4, 0.0,
                 rng.integers(1, 5, size=(count, m_, n_)) / 4).astype(np.float32)
  rv, cv = rng.random((count, m_)) < 0.7, rng.random((count, n_)) < 0.9
  plan = np.asarray(jax.jit(functools.partial(sinkhorn_plan, reg=reg, tol=1e-7))(sim, rv, cv))
  for b in range(count):
    S = sim[b][rv[b]][:, cv[b]].astype(np.float64)
    if S.size == 0:
      assert np.all(plan[b] == 0)
      continue
    P, C = S.shape
    want = sinkhorn_knopp(np.full(P, 1 / P), np.full(C, 1 / C), S, reg, num_iter_max=200000,
                          stop_thr=1e-12)
    np.testing.assert_allclose(plan[b][rv[b]][:, cv[b]], want, atol=1e-5, err_msg=f"problem {b}")
