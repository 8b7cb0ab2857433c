"""verl's optimal token baselines (optimal_token_baseline, tir_optimal_token_baseline) and GDPO
(spec §4.4) against their loop references, with their invariants and worked examples.

Agreement with verl's own functions is tests/test_otb_gdpo_crosscheck.py (on the inputs and
outputs that experiments/studies/verl_crosscheck.py recorded from verl's code).
"""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, strategies as st

from tirjax import advantages, segments
from tirjax.advantages.gdpo import GDPOOptions
from tirjax.advantages.otb import OTBOptions
from tirjax.rollouts import to_numpy
from tirjax.testing.estimator_checks import (check_padding, check_reference, check_row_permutation,
                                             option_fields)
from tirjax.testing.reference import REFERENCES
from tirjax.testing.records import GroupRecord, RowRecord, StepRecord, build_rollouts
from tirjax.testing.strategies import tree_batches

OTB = ("optimal_token_baseline", "tir_optimal_token_baseline")
VERL_OTB = OTBOptions(energy="sum_pi_squared", singleton="raw", zero_tail=True, eps=1e-8)
OTB_VARIANTS = tuple((name, opts) for name in OTB for opts in (
    OTBOptions(), OTBOptions(energy="sum_pi_squared"), OTBOptions(singleton="raw"),
    OTBOptions(zero_tail=True), VERL_OTB))
GDPO_VARIANTS = (
    ("gdpo", GDPOOptions()),
    ("gdpo", GDPOOptions(weights=(1.0, 0.5), batch_norm="tokens")),
    ("gdpo", GDPOOptions(rewards=("outcome", "format", "answer_score"), weights=(2.0, 1.0, -0.5),
                         zscore=segments.ZScore(singleton="raw"), batch_norm="none")),
    ("gdpo", GDPOOptions(rewards=("answer_score",), zscore=segments.ZScore(scale="none"),
                         whiten=segments.ZScore(ddof=0))),
)
NAMES = OTB + ("gdpo",)

# One padded shape for every ragged batch: each kernel compiles once per option set.
RAGGED = dict(num_rows=20, max_steps=4, max_tokens=32)


def with_sum_pi_squared(r, seed: int):
  """`r` with a Σ_v π(v)² per generated token consistent with its sampled π(a): between π(a)²
  (all other mass on tokens of probability ~0) and π(a)² + (1 − π(a))² (all on one)."""
  rng = np.random.default_rng(seed)
  live = np.asarray(r.loss_mask)
  pi = np.exp(np.asarray(r.old_logprobs))
  s = pi ** 2 + rng.random(pi.shape) * (1 - pi) ** 2
  return r.replace(sum_pi_squared=jnp.asarray(np.where(live, np.minimum(s, 1.0), 0.0),
                                              jnp.float32))


@st.composite
def ragged_batches(draw, multi_turn: bool = True):
  """Groups of rows whose prompts, turns and tool responses differ in length (so OTB's and
  TIR-OTB's positions differ); singleton groups, all-equal groups, rows without steps."""
  seed = draw(st.integers(0, 2**32 - 1))
  rng = np.random.default_rng(seed)
  groups, rows_left = [], RAGGED["num_rows"]
  for _ in range(draw(st.integers(1, 5))):
    n = int(rng.integers(1, min(6, rows_left) + 1))
    rows_left -= n
    same = rng.random() < 0.25  # an all-equal group
    outcome = float(rng.choice([-1.0, 0.0, 1.0]))
    rows = []
    for _ in range(n):
      steps = []
      for _ in range(int(rng.integers(0, 5)) if rng.random() < 0.9 else 0):
        k = int(rng.integers(1, 5))
        steps.append(StepRecord(
            tokens=tuple(range(4, 4 + k)), logprobs=tuple(-rng.exponential(1.0, k)),
            response_tokens=(9,) * (int(rng.integers(0, 4)) if multi_turn else 0),
            format_reward=float(rng.choice([-0.25, 0.0, 0.25]))))
      if not multi_turn and steps:  # one turn: every generated token contiguous
        steps = [StepRecord(tokens=sum((s.tokens for s in steps), ()),
                            logprobs=sum((s.logprobs for s in steps), ()))]
      rows.append(RowRecord(outcome=outcome if same else float(rng.choice([-1.0, 0.0, 1.0])),
                            steps=steps, prompt_tokens=(1,) * int(rng.integers(1, 4))))
    groups.append(GroupRecord(rows=rows))
    if rows_left == 0:
      break
  r = build_rollouts(groups, **RAGGED)
  return with_sum_pi_squared(r, seed)


def check_gdpo(r, variants=GDPO_VARIANTS):
  """GDPO against its reference. The batch step divides by the spread of the decoupled sums,
  which can be float32 rounding alone (two rewards whose z-scores cancel up to their eps
  terms: sums of ~1e-5), so the tolerance grows as 1e-6 / that spread."""
  batch = to_numpy(r)
  valid = batch["row_valid"]
  for name, opts in variants:
    out = advantages.get(name)(r, opts)
    ref = REFERENCES[name](batch, **option_fields(opts))
    total = np.asarray(out.extras["decoupled"])[valid]
    spread = total.std() if opts.batch_norm != "none" and total.size > 1 else 1.0
    for key in ("steps", "rows", "tokens"):
      if key in ref:
        np.testing.assert_allclose(getattr(out, key), ref[key], rtol=1e-5,
                                   atol=2e-5 + 1e-6 / max(spread, 1e-12), err_msg=f"{opts}")
    assert all(np.all(np.isfinite(np.asarray(x))) for x in (out.tokens, out.rows))


@given(ragged_batches(), st.integers(0, 2**32 - 1))
def test_reference_on_ragged_turns(r, seed):
  """Against the loop references for every variant; reordering rows reorders the outputs;
  padding rows, steps, calls and tokens change nothing."""
  check_reference(r, OTB_VARIANTS)
  check_gdpo(r)
  check_row_permutation(r, seed, NAMES, "tokens")
  check_padding(r, seed, NAMES, "tokens")


@given(tree_batches(), st.integers(0, 2**32 - 1))
def test_reference_on_trees(r, seed):
  """The same on random trees (shared prefixes, dropped branches, padding rows)."""
  r = with_sum_pi_squared(r, seed)
  check_reference(r, OTB_VARIANTS)
  check_gdpo(r)
  check_row_permutation(r, seed, NAMES, "tokens")


@given(ragged_batches())
def test_degenerate_groups_get_zero(r):
  """spec §3 under the defaults: a group of one row, a group whose rows share one outcome and a
  row without generated tokens get exactly 0 from both OTBs; nothing is NaN or Inf."""
  gid, valid, outcome = (np.asarray(x) for x in (r.group_id, r.row_valid, r.outcome))
  live = np.asarray(r.loss_mask) & valid[:, None]
  for name in OTB:
    out = advantages.get(name)(r)
    tokens = np.asarray(out.tokens)
    assert np.all(np.isfinite(tokens)) and not np.any(tokens[~live])
    for g in np.unique(gid[valid]):
      rows = np.flatnonzero(valid & (gid == g))
      if len(rows) == 1 or np.ptp(outcome[rows]) == 0:
        assert not np.any(tokens[rows]), (name, rows)


@given(ragged_batches(multi_turn=False))
def test_one_turn_rows_give_otb_and_tir_otb_alike(r):
  """Without tool responses a row's k-th generated token is its k-th response token, so the
  two alignments are one (spec §3's defaults, where empty rows change neither)."""
  a = advantages.get("optimal_token_baseline")(r)
  b = advantages.get("tir_optimal_token_baseline")(r)
  np.testing.assert_allclose(a.tokens, b.tokens, atol=1e-6)


def test_worked_example_and_verl_energy():
  """The docstring's example: W = (0.5, 1) and (1.5, 1.5) give B = (−0.5, −0.2)."""
  rows = [RowRecord(outcome=1, steps=[StepRecord(tokens=(4, 5), logprobs=(np.log(0.5),) * 2)]),
          RowRecord(outcome=-1, steps=[StepRecord(tokens=(4, 5), logprobs=(np.log(0.1), 0.0))])]
  r = build_rollouts([GroupRecord(rows=rows)])
  live = np.asarray(r.loss_mask)
  s2 = np.zeros(live.shape, np.float32)
  s2[0, live[0]], s2[1, live[1]] = [0.5, 0.5], [0.7, 1.0]  # w = (0.5, 0.5) and (1.5, 0)
  r = r.replace(sum_pi_squared=jnp.asarray(s2))
  for name in OTB:
    out = advantages.get(name)(r, OTBOptions(energy="sum_pi_squared"))
    np.testing.assert_allclose(np.asarray(out.tokens)[live], [1.5, 1.2, -0.5, -0.8], atol=1e-6)
    np.testing.assert_allclose(np.asarray(out.extras["energy"])[live], [0.5, 1, 1.5, 1.5],
                               atol=1e-6)
    # The sampled proxy: w = 1 − π = (0.5, 0.5) and (0.9, 0): W = (0.5, 1), (0.9, 0.9).
    out = advantages.get(name)(r)
    b0, b1 = (0.5 - 0.9) / 1.4, (1 - 0.9) / 1.9
    np.testing.assert_allclose(np.asarray(out.tokens)[live],
                               [1 - b0, 1 - b1, -1 - b0, -1 - b1], atol=1e-6)


def test_tool_responses_shift_otb_positions_not_tir_otb():
  """Row 1's tool response after its first token puts its second token at response position
  2, where no other row is: OTB gives it 0 there (a position of one row), TIR-OTB pairs it
  with row 0's second token."""
  rows = [RowRecord(outcome=1, steps=[StepRecord(tokens=(4, 5), logprobs=(-1.0, -1.0))]),
          RowRecord(outcome=-1, steps=[
              StepRecord(tokens=(4,), logprobs=(-1.0,), response_tokens=(9,)),
              StepRecord(tokens=(5,), logprobs=(-1.0,))])]
  r = build_rollouts([GroupRecord(rows=rows)])
  live = np.asarray(r.loss_mask)
  otb = np.asarray(advantages.get("optimal_token_baseline")(r).tokens)
  tir = np.asarray(advantages.get("tir_optimal_token_baseline")(r).tokens)
  np.testing.assert_allclose(tir[live], [1, 1, -1, -1], atol=1e-6)  # equal energies: mean 0
  np.testing.assert_allclose(otb[live], [1, 0, -1, 0], atol=1e-6)
  tail = np.asarray(advantages.get("optimal_token_baseline")(
      r, OTBOptions(zero_tail=True)).tokens)
  np.testing.assert_allclose(tail[live], [1, 0, -1, -1], atol=1e-6)  # row 1 spans 3 positions


def test_zero_tail_gives_the_longest_row_its_return():
  """verl's zero tail: the strictly longest row's tokens past the second-longest length keep
  their return; a tie for the longest has no tail."""
  def row(outcome, n):
    return RowRecord(outcome=outcome, steps=[StepRecord(tokens=(4,) * n, logprobs=(-0.5,) * n)])
  r = build_rollouts([GroupRecord(rows=[row(1, 4), row(-1, 2)]),
                      GroupRecord(rows=[row(1, 3), row(-1, 3), row(0, 1)])])
  live = np.asarray(r.loss_mask)
  for name in OTB:
    off = np.asarray(advantages.get(name)(r).tokens)
    on = np.asarray(advantages.get(name)(r, OTBOptions(zero_tail=True)).tokens)
    np.testing.assert_allclose(off[0][live[0]], [1, 1, 0, 0], atol=1e-6)
    np.testing.assert_allclose(on[0][live[0]], [1, 1, 1, 1], atol=1e-6)
    np.testing.assert_allclose(on[2:], off[2:], atol=1e-6)  # tied longest rows: no tail


@given(ragged_batches(multi_turn=False))
def test_equal_lengths_and_energies_give_dr_grpo(r):
  """With one π(a) everywhere every row's W_p is the same, so B_p is the plain mean of the
  rows that reach p; on groups whose rows have one length that is Dr. GRPO's R − mean."""
  live = np.asarray(r.loss_mask)
  r = r.replace(old_logprobs=jnp.where(r.loss_mask, -0.7, 0.0))
  gid, valid = np.asarray(r.group_id), np.asarray(r.row_valid)
  lengths = live.sum(1)
  dr = np.asarray(advantages.get("dr_grpo")(r).tokens)
  tir = np.asarray(advantages.get("tir_optimal_token_baseline")(r).tokens)
  for g in np.unique(gid[valid]):
    rows = np.flatnonzero(valid & (gid == g))
    if np.ptp(lengths[rows]) == 0:
      np.testing.assert_allclose(tir[rows], dr[rows], atol=1e-5)


@given(tree_batches())
def test_gdpo_of_one_reward_without_batch_step_is_grpo(r):
  """One reward, no batch normalisation: GRPO's z-score (times the weight)."""
  grpo = np.asarray(advantages.get("grpo")(r).rows)
  out = advantages.get("gdpo")(r, GDPOOptions(rewards=("outcome",), weights=(2.0,),
                                              batch_norm="none"))
  np.testing.assert_allclose(out.rows, 2.0 * grpo, atol=1e-5)


@given(tree_batches())
def test_gdpo_rows_are_whitened_over_the_batch(r):
  """After the batch step the valid rows have mean 0 and std s / (s + 1e-4) (ddof 1, s the
  decoupled sums' std), unless the decoupled
  sums are equal up to the batch step's eps, 1e-4 (then all 0)."""
  out = advantages.get("gdpo")(r)
  valid = np.asarray(r.row_valid)
  rows, total = np.asarray(out.rows)[valid], np.asarray(out.extras["decoupled"])[valid]
  if rows.size < 2 or np.ptp(total) <= 1e-4 * max(1.0, np.abs(total).max()):
    assert not np.any(rows)
  else:
    spread = total.std(ddof=1)
    assert abs(rows.mean()) < 1e-5
    assert rows.std(ddof=1) == pytest.approx(spread / (spread + 1e-4), abs=1e-4)


def test_gdpo_worked_example():
  rows = [RowRecord(outcome=1, steps=[StepRecord(format_reward=-0.25)]),
          RowRecord(outcome=-1, steps=[StepRecord(format_reward=0.25)])]
  r = build_rollouts([GroupRecord(rows=rows)])
  out = advantages.get("gdpo")(r, GDPOOptions(weights=(1.0, 0.5)))
  np.testing.assert_allclose(out.extras["decoupled"], [0.35355, -0.35355], atol=1e-5)
  np.testing.assert_allclose(out.rows, [0.70697, -0.70697], atol=1e-5)  # 0.354 / (0.5 + 1e-4)
  np.testing.assert_allclose(advantages.get("gdpo")(r).rows, [0.0, 0.0])  # the rewards cancel
  np.testing.assert_allclose(advantages.get("grpo_fm")(r).rows, [0.70711, -0.70711], atol=1e-5)


def test_verl_energy_without_the_field_is_refused_by_name():
  r = build_rollouts([GroupRecord(rows=[RowRecord(outcome=1, steps=[StepRecord()])] * 2)])
  for name in OTB:
    with pytest.raises(ValueError, match="sum_pi_squared"):
      advantages.get(name)(r, OTBOptions(energy="sum_pi_squared"))


@pytest.mark.parametrize("make, field", [
    (lambda: OTBOptions(energy="exact"), "energy"),
    (lambda: OTBOptions(singleton="drop"), "singleton"),
    (lambda: OTBOptions(zero_tail=1), "zero_tail"),
    (lambda: OTBOptions(eps=-1e-8), "eps"),
    (lambda: GDPOOptions(rewards=("outcome", "length")), "rewards"),
    (lambda: GDPOOptions(rewards=()), "rewards"),
    (lambda: GDPOOptions(rewards=("outcome", "outcome")), "rewards"),
    (lambda: GDPOOptions(weights=(1.0,)), "weights"),
    (lambda: GDPOOptions(weights=(1.0, float("nan"))), "weights"),
    (lambda: GDPOOptions(zscore="std"), "zscore"),
    (lambda: GDPOOptions(batch_norm="sequences"), "batch_norm"),
])
def test_invalid_options_name_the_option(make, field):
  with pytest.raises(ValueError, match=field):
    make()
