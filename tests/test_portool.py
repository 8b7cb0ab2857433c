"""PORTool (spec §4.1): a hand-worked tree, kernel against reference, invariants, options."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

from tirjax.rollouts import to_numpy
from tirjax.testing.padding import pad, permute_rows
from tirjax.testing.strategies import SHAPE, tree_batches
from tirjax.testing.reference import REFERENCES
from tirjax import advantages, segments
from tirjax.advantages.portool import PORToolOptions
from tirjax.testing.records import GroupRecord, RowRecord, StepRecord, build_rollouts

EST = advantages.get("portool")
H = 1 / np.sqrt(2)  # |z| of either of two distinct values (ddof = 1), up to eps


def run(r, **options):
  return EST(r, PORToolOptions(**options))


def hand_tree():
  """One query, γ = 0.95, three levels of forks:

      root ─┬─ A ─┬─ A1 ─┬─ A1a   row 0, R_out +1, T = 3
            │     │      └─ A1b   row 1, R_out −1, T = 3
            │     └─ A2           row 2, R_out +1, T = 2
            └─ B ─── B1           row 3, R_out +1, T = 2

  Forks: root, A, A1 (n_forks = 3); A is shared by 3 rows, A1 by 2.
  """
  fm = dict(A=0.25, B=0.15, A1=0.25, A2=0.05, A1a=0.25, A1b=-0.25, B1=0.25)

  def row(path, outcome):
    return RowRecord(steps=[StepRecord(node=n, format_reward=fm[n]) for n in path],
                     outcome=outcome)

  rows = [row(["A", "A1", "A1a"], 1), row(["A", "A1", "A1b"], -1), row(["A", "A2"], 1),
          row(["B", "B1"], 1)]
  # Padded to the shape of the property tests, whose compiled kernels it reuses.
  return build_rollouts([GroupRecord(rows=rows)], num_rows=SHAPE[0], max_steps=SHAPE[1],
                        max_calls=2, max_gt_calls=2)


def hand(x, steps=True):
  """The 4 rows (× 3 steps) of the hand-worked tree; the padding around them must be 0."""
  x = np.asarray(x)
  inner = x[:4, :3] if steps else x[:4]
  rest = x.copy()
  rest[(slice(0, 4), slice(0, 3)) if steps else slice(0, 4)] = 0
  assert not np.any(rest), "padding rows / steps must be 0"
  return inner


def test_hand_worked_tree():
  out = run(hand_tree())
  # Max terms γ^(T_k − t)·R_out: at the root A: max(γ², −γ², γ) = γ, B: γ → tie → mean:
  #   G(A) = (γ² − γ² + γ)/3 = 0.316667, G(B) = γ = 0.95.
  # At A: A1: max(γ, −γ) = γ vs A2: 1 → differ → max: G(A1) = 0.95, G(A2) = 1.
  # At A1: A1a: 1 vs A1b: −1 → max. B has one child: G(B1) = mean = 1.
  np.testing.assert_allclose(hand(out.extras["node_reward"]), [[0.566667, 1.2, 1.25],
                                                               [0.566667, 1.2, -1.25],
                                                               [0.566667, 1.05, 0.0],
                                                               [1.1, 1.25, 0.0]], atol=1e-5)
  # Two children per fork: z = ±1/√2; B1's parent is not a fork.
  np.testing.assert_allclose(hand(out.extras["a_fork"]), [[-H, H, H], [-H, H, -H], [-H, -H, 0],
                                                          [H, 0, 0]], atol=2e-5)
  # R_out = (1, −1, 1, 1): mean 0.5, std 1 → A_trj = R_out − 0.5.
  np.testing.assert_allclose(hand(out.extras["a_trj"], False), [0.5, -1.5, 0.5, 0.5], atol=1e-5)
  # κ = n / (|m(p)| · n_forks): root 4/(4·3), A 4/(3·3), A1 4/(2·3).
  np.testing.assert_allclose(hand(out.extras["kappa"]), [[1 / 3, 4 / 9, 2 / 3],
                                                         [1 / 3, 4 / 9, 2 / 3],
                                                         [1 / 3, 4 / 9, 0], [1 / 3, 0, 0]],
                             atol=1e-6)
  np.testing.assert_array_equal(hand(out.extras["num_forks"], False), [3, 3, 3, 3])
  # Ā_trj: A (rows 0,1,2) −1/6, A1 (rows 0,1) −0.5, others their row's.
  # A: −1/6 − H/3; A1: −0.5 + 4H/9; A1a: 0.5 + 2H/3; A1b: −1.5 − 2H/3; A2: 0.5 − 4H/9;
  # B: 0.5 + H/3; B1: 0.5.
  want = [[-0.402369, -0.185730, 0.971405], [-0.402369, -0.185730, -1.971405],
          [-0.402369, 0.185730, 0.0], [0.735702, 0.5, 0.0]]
  np.testing.assert_allclose(hand(out.steps), want, atol=2e-5)
  np.testing.assert_allclose(hand(out.rows, False), [0.5, -1.5, 0.5, 0.5], atol=1e-5)
  # One token per step after a one-token prompt.
  tokens = np.asarray(out.tokens)
  np.testing.assert_allclose(tokens[:4, 1:], want, atol=2e-5)
  assert not np.any(tokens[:, 0]) and not np.any(tokens[4:])


def test_hand_worked_tree_options():
  r = hand_tree()
  # G = max everywhere: at the root G(A) = γ = G(B), so R(A) = 1.2 > R(B) = 1.1:
  # A: −1/6 + H/3, B: 0.5 − H/3.
  out = run(r, tree_aggregation="max")
  np.testing.assert_allclose(hand(out.steps)[:, 0], [0.069036] * 3 + [0.264298], atol=2e-5)
  # G = mean everywhere: at A, G(A1) = (γ − γ)/2 = 0 so R(A1) = 0.25 < R(A2) = 1.05:
  # A1: −0.5 − 4H/9, A2: 0.5 + 4H/9.
  out = run(r, tree_aggregation="mean")
  np.testing.assert_allclose(hand(out.steps)[:3, 1], [-0.814270, -0.814270, 0.814270], atol=2e-5)
  # Each row's own A_trj: the shared steps A and A1 differ across rows.
  out = run(r, shared_step_trj="own")
  np.testing.assert_allclose(hand(out.steps)[:3, 0], [0.264298, -1.735702, 0.264298], atol=2e-5)
  np.testing.assert_allclose(hand(out.steps)[:2, 1], [0.814270, -1.185730], atol=2e-5)
  # κ = 1: each step is Ā_trj ± H.
  out = run(r, fork_scale="none")
  np.testing.assert_allclose(hand(out.steps), [[-0.873773, 0.207107, 1.207107],
                                               [-0.873773, 0.207107, -2.207107],
                                               [-0.873773, -0.207107, 0.0],
                                               [1.207107, 0.5, 0.0]], atol=2e-5)


# The hand-worked variants first (their compiled kernels are shared), then a mixed set.
OPTION_SETS = (
    {},
    dict(tree_aggregation="max"),
    dict(tree_aggregation="mean"),
    dict(shared_step_trj="own"),
    dict(fork_scale="none"),
    dict(gamma=0.8, omega1=0.5, omega2=2.0, tree_aggregation="max", shared_step_trj="own",
         zscore=segments.ZScore(ddof=0, singleton="raw")),
    dict(zscore=segments.ZScore(scale="none")),
)


@given(tree_batches(), st.sampled_from(OPTION_SETS))
def test_matches_reference(r, options):
  out = run(r, **options)
  ref = REFERENCES["portool"](to_numpy(r), **options)
  np.testing.assert_allclose(out.steps, ref["steps"], atol=3e-5, rtol=1e-5)
  np.testing.assert_allclose(out.rows, ref["rows"], atol=3e-5, rtol=1e-5)
  for name, x in [("tokens", out.tokens), *out.extras.items()]:
    assert np.all(np.isfinite(x)), name


@given(tree_batches(), st.integers(0, 2**32 - 1))
def test_row_permutation_permutes_output(r, seed):
  perm = np.random.default_rng(seed).permutation(r.num_rows)
  out, moved = run(r), run(permute_rows(r, perm))
  np.testing.assert_allclose(moved.steps, np.asarray(out.steps)[perm], atol=1e-5)
  np.testing.assert_allclose(moved.extras["node_reward"],
                             np.asarray(out.extras["node_reward"])[perm], atol=1e-5)


@given(tree_batches(), st.integers(0, 2**32 - 1))
def test_padding_changes_nothing(r, seed):
  big, rows = pad(r, np.random.default_rng(seed), extra_rows=5, extra_steps=2, extra_calls=1,
                  extra_gt=1, extra_tokens=3)
  out, padded = run(r), run(big)
  T = r.max_steps
  np.testing.assert_allclose(np.asarray(padded.steps)[rows, :T], out.steps, atol=1e-5)
  np.testing.assert_allclose(np.asarray(padded.rows)[rows], out.rows, atol=1e-5)
  rest = np.ones(big.num_rows, bool)
  rest[rows] = False
  assert not np.any(np.asarray(padded.steps)[rest]) and not np.any(np.asarray(padded.steps)[:, T:])
  assert not np.any(np.asarray(padded.tokens)[rest])


@given(tree_batches(), st.sampled_from([-0.4, 0.1, 3.0]))
def test_format_reward_shift_changes_nothing(r, shift):
  """R_fm enters only R(s), compared among siblings: a common shift cancels in A_fork."""
  shifted = r.replace(format_reward=r.format_reward + shift * r.step_valid)
  np.testing.assert_allclose(run(shifted).steps, run(r).steps, atol=1e-4)


@given(tree_batches(kinds=("independent",)))
def test_independent_rollouts_without_fork_term_is_grpo(r):
  out = run(r, omega2=0.0)
  grpo = advantages.get("grpo")(r)
  np.testing.assert_allclose(out.steps, grpo.steps, atol=1e-6)
  np.testing.assert_allclose(out.rows, grpo.rows, atol=1e-6)


@given(tree_batches(kinds=("independent",)))
def test_independent_rollouts_have_kappa_one(r):
  """The root is the only fork (when a group has two rows with steps), so κ = 1."""
  out = run(r)
  parent_fork = np.asarray(out.extras["parent_fork"])
  np.testing.assert_allclose(np.asarray(out.extras["kappa"])[parent_fork], 1.0, rtol=1e-6)
  assert not np.any(np.asarray(out.extras["is_fork"]))


@pytest.mark.parametrize("field, value", [
    ("gamma", 1.5), ("gamma", -0.1), ("omega1", -1.0), ("omega2", float("nan")),
    ("tree_aggregation", "median"), ("shared_step_trj", "first"), ("fork_scale", "per_row"),
    ("tie_tol", -1e-6), ("zscore", {"ddof": 1}),
])
def test_invalid_options_name_the_option(field, value):
  with pytest.raises(ValueError, match=field):
    PORToolOptions(**{field: value})


def test_make_options_rejects_unknown_keys():
  with pytest.raises(ValueError, match="tree_agg"):
    EST.make_options({"tree_agg": "max"})
  assert EST.make_options({"gamma": 0.9}) == PORToolOptions(gamma=0.9)
