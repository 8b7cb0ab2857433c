"""verl's estimators (spec §4.4): reinforce_plus_plus, reinforce_plus_plus_baseline, remax,
opo, gpg, grpo_passk against their loop references, with their invariants.

Agreement with verl's own functions, measured once (not a test: verl is not a dependency).
verl commit b178a3cd56f58b2d502255daba591e92833930a7 (2026-01-29), `verl/trainer/ppo/
core_algos.py`: each `compute_*_outcome_advantage` (and `masked_whiten` of
`verl/utils/torch_functional.py`) was exec'd from the fetched source in a scratch script
outside the repository, on 200 random single-turn batches (2-8 groups of 2-8 rows, outcomes in
{-1, 0, +1}, 1-11 response tokens after 1-3 prompt tokens, padded to 64 rows: verl saw the
valid rows only), and its token advantages compared with these kernels' on the response
tokens (padding rows: all 0). Max |tirjax − verl|:

  reinforce_plus_plus, γ = 1       5.5e-06   (whitening: verl divides by sqrt(var + 1e-8),
  reinforce_plus_plus, γ = 0.9     7.2e-06    spec §3 by std + 1e-6)
  reinforce_plus_plus_baseline     7.2e-06
  remax                            0
  opo                              0
  gpg (valid_rows="nonzero_reward", verl's count)   2.4e-07
  grpo_passk, std / no std         2.4e-07 / 0

Groups of one row were left out (verl returns the raw reward or raises; spec §3 gives 0), and
rows of a multi-turn batch were not compared for reinforce_plus_plus (verl resets the return
at every tool response; see `verl_baselines.token_returns`).
"""

import numpy as np
import pytest
from hypothesis import given, strategies as st

from tirjax.testing.estimator_checks import check_padding, check_reference, check_row_permutation
from tirjax.testing.strategies import tree_batches
from tirjax import advantages, segments
from tirjax.advantages.verl_baselines import (GPGOptions, OPOOptions, PassKOptions,
                                              ReinforcePPBaselineOptions, ReinforcePPOptions,
                                              ReMaxOptions)
from tirjax.testing.records import GroupRecord, RowRecord, StepRecord, build_rollouts

VARIANTS = (
    ("reinforce_plus_plus", ReinforcePPOptions()),
    ("reinforce_plus_plus", ReinforcePPOptions(gamma=0.9)),
    ("reinforce_plus_plus", ReinforcePPOptions(gamma=0.0, zscore=segments.ZScore(ddof=0))),
    ("reinforce_plus_plus_baseline", ReinforcePPBaselineOptions()),
    ("reinforce_plus_plus_baseline",
     ReinforcePPBaselineOptions(group=segments.ZScore(scale="none", singleton="raw"))),
    ("remax", ReMaxOptions()),
    ("opo", OPOOptions()),
    ("opo", OPOOptions(singleton="raw")),
    ("gpg", GPGOptions()),
    ("gpg", GPGOptions(valid_rows="nonzero_reward", singleton="raw")),
    ("grpo_passk", PassKOptions()),
    ("grpo_passk", PassKOptions(segments.ZScore(scale="none"))),
    ("grpo_passk", PassKOptions(segments.ZScore(ddof=0, singleton="raw"))),
)
NAMES = sorted({name for name, _ in VARIANTS})


@given(tree_batches(), st.integers(0, 2**32 - 1))
def test_reference_row_permutation_and_padding(r, seed):
  """Against the loop reference for every variant; rows reordered, outputs reordered; padding
  rows, steps, calls and tokens change nothing."""
  check_reference(r, VARIANTS)
  check_row_permutation(r, seed, NAMES, "tokens")
  check_padding(r, seed, NAMES, "tokens")


@given(tree_batches())
def test_reinforce_plus_plus_tokens_are_whitened_over_the_batch(r):
  """γ = 1: every generated token carries its row's R_out, whitened: mean 0, std 1 (ddof 1)
  over the batch's generated tokens unless they are all equal (then all 0)."""
  out = np.asarray(advantages.get("reinforce_plus_plus")(r).tokens)
  live = np.asarray(r.loss_mask) & np.asarray(r.row_valid)[:, None]
  values = np.broadcast_to(np.asarray(r.outcome)[:, None], live.shape)[live]
  if values.size < 2 or np.ptp(values) == 0:
    assert not np.any(out)
  else:
    assert abs(out[live].mean()) < 1e-5
    assert out[live].std(ddof=1) == pytest.approx(1.0, abs=1e-4)


@given(tree_batches())
def test_passk_pushes_one_row_per_group_up(r):
  """Only a group's best row moves, upwards, and only when no other row ties its outcome
  (a tied best has margin 0)."""
  out = np.asarray(advantages.get("grpo_passk")(r).rows)
  gid, valid, outcome = (np.asarray(x) for x in (r.group_id, r.row_valid, r.outcome))
  for g in np.unique(gid[valid]):
    rows = np.flatnonzero(valid & (gid == g))
    moved = rows[out[rows] != 0]
    if np.sum(outcome[rows] == outcome[rows].max()) == 1 and len(rows) > 1:
      assert moved.tolist() == [rows[np.argmax(outcome[rows])]] and out[moved[0]] > 0
    else:
      assert len(moved) == 0


@given(tree_batches())
def test_gpg_is_dr_grpo_rescaled_by_batch_over_varied_rows(r):
  gpg, dr = advantages.get("gpg")(r), advantages.get("dr_grpo")(r)
  gid, valid, outcome = (np.asarray(x) for x in (r.group_id, r.row_valid, r.outcome))
  varied = sum(np.sum(valid & (gid == g)) for g in np.unique(gid[valid])
               if np.ptp(outcome[valid & (gid == g)]) > 0)
  alpha = valid.sum() / varied if varied else 0.0
  np.testing.assert_allclose(gpg.rows, alpha * np.asarray(dr.rows), atol=1e-5)
  assert float(gpg.extras["alpha"]) == pytest.approx(alpha, rel=1e-6)


def test_opo_weighs_rows_by_their_generated_tokens():
  """Rows of 1 and 3 tokens, rewards +1 and -1: baseline (1 - 3)/4 = -0.5 (the mean is 0)."""
  rows = [RowRecord(outcome=1, steps=[StepRecord(tokens=(4,))]),
          RowRecord(outcome=-1, steps=[StepRecord(tokens=(4, 5), response_tokens=(9,)),
                                       StepRecord(tokens=(6,))])]
  out = advantages.get("opo")(build_rollouts([GroupRecord(rows=rows)]))
  np.testing.assert_allclose(out.rows, [1.5, -0.5])
  np.testing.assert_allclose(out.extras["baseline"], [-0.5, -0.5])


def test_remax_subtracts_the_greedy_outcome_and_needs_it():
  groups = [GroupRecord(greedy_outcome=1.0, rows=[RowRecord(outcome=o, steps=[StepRecord()])
                                                  for o in (1, 0, -1)]),
            GroupRecord(greedy_outcome=-1.0, rows=[RowRecord(outcome=1, steps=[StepRecord()])])]
  out = advantages.get("remax")(build_rollouts(groups, with_greedy=True))
  np.testing.assert_allclose(out.rows, [0.0, -1.0, -2.0, 2.0])
  with pytest.raises(ValueError, match="greedy_outcome"):
    advantages.get("remax")(build_rollouts(groups))


def test_reinforce_plus_plus_discounts_over_generated_tokens_only():
  """γ^(generated tokens after t): the tool response between the steps neither discounts nor
  resets the return (verl's single-turn loop would reset it there)."""
  row = RowRecord(outcome=1, steps=[StepRecord(tokens=(4, 5), response_tokens=(9, 9, 9)),
                                    StepRecord(tokens=(6,))])
  r = build_rollouts([GroupRecord(rows=[row])])
  from tirjax.advantages.verl_baselines import token_returns
  got = np.asarray(token_returns(r, 0.5))[0]
  want = np.zeros_like(got)
  want[np.asarray(r.loss_mask)[0]] = [0.25, 0.5, 1.0]
  np.testing.assert_allclose(got, want)


@pytest.mark.parametrize("make, field", [
    (lambda: ReinforcePPOptions(gamma=1.5), "gamma"),
    (lambda: ReinforcePPOptions(zscore=None), "zscore"),
    (lambda: ReinforcePPBaselineOptions(whiten="std"), "whiten"),
    (lambda: OPOOptions(singleton="drop"), "singleton"),
    (lambda: GPGOptions(valid_rows="all"), "valid_rows"),
    (lambda: PassKOptions(zscore=1), "zscore"),
])
def test_invalid_options_name_the_option(make, field):
  with pytest.raises(ValueError, match=field):
    make()
