"""MT-GRPO (spec §4.4): against its loop reference, the bias of per-turn-index normalisation
(verl's RFC #7244) measured exactly on a stop-or-continue choice, and against the paper's code.

The paper's code (SiliangZeng/Multi-Turn-RL-Agent, commit 7dbdd08bdb27, 2025-06-12): its
`_compute_normalized_advantages` and `_assign_advantages` ran once on 20 random batches of
two-turn and one-turn rows (experiments/studies/mt_grpo_crosscheck.py, which reads them from
the code's source; benchmarks/results/mt_grpo_crosscheck.json holds the inputs and its
advantages, never its code). `mt_grpo` with the code's two-turn form (`credit="immediate"`,
eps 1e-4) on the same batches, the turn reward given as the first turn's reward:

  rows with a tool result (two turns): 0 mismatches in 813 tokens (|difference| ≤ 2.7e-7)
  rows without one (one turn):         59 of 81 rows differ (up to 1.47), declared: the code
      switches such a row to z(R_turn + R_out) over the group, a formula chosen by the row's
      own action (it did not call a tool); `mt_grpo` gives every row z(R_out) + λ z_t(r)
      alike (here r = 0 for them).
"""

import itertools
import json
import os

import numpy as np
import pytest
from hypothesis import given, strategies as st

from tirjax import advantages, segments
from tirjax.advantages.mt_grpo import MTGRPOOptions
from tirjax.testing.estimator_checks import check_padding, check_reference, check_row_permutation
from tirjax.testing.records import GroupRecord, RowRecord, StepRecord, build_rollouts
from tirjax.testing.strategies import tree_batches

VARIANTS = tuple(("mt_grpo", MTGRPOOptions(credit=c, turn_reward=t, coef=k, zscore=z,
                                           matching=m[0] if m else "greedy"))
                 for c, t, k, z, *m in [
                     ("return_loo", "match", 1.0, segments.ZScore()),
                     ("return_loo", "match", 1.0, segments.ZScore(), "hungarian"),
                     ("immediate", "match", 1.0, segments.ZScore()),
                     ("return_per_index", "match", 0.5, segments.ZScore(ddof=0)),
                     ("return_loo", "format", 2.0, segments.ZScore(singleton="raw")),
                     ("immediate", "format", 1.0, segments.ZScore(eps=1e-4)),
                     ("return_per_index", "format", 1.0, segments.ZScore())])
RESULT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "benchmarks", "results", "mt_grpo_crosscheck.json")


@given(tree_batches(), st.integers(0, 2**32 - 1))
def test_reference_row_permutation_and_padding(r, seed):
  check_reference(r, VARIANTS)
  check_row_permutation(r, seed, ["mt_grpo"])
  check_padding(r, seed, ["mt_grpo"])


@given(tree_batches())
def test_no_turn_weight_is_grpo(r):
  out = advantages.get("mt_grpo")(r, MTGRPOOptions(coef=0.0))
  np.testing.assert_allclose(out.steps, advantages.get("grpo")(r).steps, atol=1e-6)


def stop_or_continue(continues) -> object:
  """One group: each row's first turn (reward 0) either answers (stops) or calls a tool and
  then answers with a turn reward of 0.25; R_out is 0 for every row."""
  rows = [RowRecord(outcome=0, steps=[StepRecord(format_reward=0.0)] + (
      [StepRecord(format_reward=0.25)] if c else [])) for c in continues]
  return build_rollouts([GroupRecord(rows=rows)], max_steps=2)


def test_worked_example_of_the_bias():
  r = stop_or_continue([False, True])
  def first_turn(credit):
    opts = MTGRPOOptions(credit=credit, turn_reward="format")
    return np.asarray(advantages.get("mt_grpo")(r, opts).steps)[:, 0]
  np.testing.assert_allclose(first_turn("return_loo"), [-0.25, 0.25])
  np.testing.assert_allclose(first_turn("return_per_index"), [0.0, 0.0])
  np.testing.assert_allclose(first_turn("immediate"), [0.0, 0.0])


@pytest.mark.parametrize("q", [0.3, 0.7])
def test_per_index_normalisation_loses_what_continuing_earns(q):
  """Exact expected policy gradient of the first turn's stop/continue choice (π(continue) =
  q = σ(θ), 4 rows, all 16 outcomes enumerated): the true gradient of E[Σ turn rewards] is
  0.25 q (1 − q) per row. "return_loo" gives exactly that (its baseline is the other rows');
  "return_per_index" gives 0: continuing's expected turn reward is subtracted away, RFC #7244's
  −E[R_intermediate] per extra turn."""
  n = 4
  grads = {c: 0.0 for c in ("return_loo", "return_per_index")}
  for continues in itertools.product([False, True], repeat=n):
    p = np.prod([q if c else 1 - q for c in continues])
    r = stop_or_continue(continues)
    score = np.array([1 - q if c else -q for c in continues])  # ∂ log π(a) / ∂θ
    for credit in grads:
      adv = np.asarray(advantages.get("mt_grpo")(
          r, MTGRPOOptions(credit=credit, turn_reward="format")).steps)[:, 0]
      grads[credit] += p * float(np.mean(adv * score))
  assert grads["return_loo"] == pytest.approx(0.25 * q * (1 - q), abs=1e-6)
  assert grads["return_per_index"] == pytest.approx(0.0, abs=1e-6)


def test_match_turn_reward_is_the_matched_call_similarity():
  """Turn rewards from the calls: a turn whose call matches the ground truth exactly gets 1,
  a turn without calls (the answer) 0."""
  add = {"name": "add", "arguments": {"a": 1}}
  answer = {"name": "response_gen", "arguments": {"answer": "1"}}
  rows = [RowRecord(outcome=1, steps=[StepRecord(calls=[add]), StepRecord(calls=[answer])]),
          RowRecord(outcome=-1, steps=[StepRecord(calls=[answer])])]
  out = advantages.get("mt_grpo")(build_rollouts([GroupRecord(gt_calls=[add], rows=rows)]))
  np.testing.assert_allclose(out.extras["turn_reward"], [[1.0, 0.0], [0.0, 0.0]])
  # return_loo at turn 0: G = 1 and 0, so ±1 on top of GRPO's ±0.707.
  np.testing.assert_allclose(np.asarray(out.steps)[:, 0], [0.70711 + 1, -0.70711 - 1],
                             atol=1e-5)


def peer_rollouts(case: dict):
  """A batch of the code's as `Rollouts`: a two-turn row is a step with the turn reward as its
  format reward, its tool result, and the answer step (format 0); a one-turn row its answer."""
  rows = []
  for layout, reward, outcome in zip(case["layout"], case["turn_reward"], case["outcome"]):
    steps = [StepRecord(tokens=(4,) * layout[0], format_reward=reward,
                        response_tokens=(9,) * (layout[1] if len(layout) == 3 else 0))]
    if len(layout) == 3:
      steps.append(StepRecord(tokens=(4,) * layout[2], format_reward=0.0))
    rows.append(RowRecord(outcome=outcome, steps=steps))
  groups = [GroupRecord(rows=rows[i:i + 4]) for i in range(0, len(rows), 4)]
  return build_rollouts(groups, num_rows=16, max_steps=2, max_tokens=16)


def test_matches_the_papers_code_where_a_row_has_its_tool_result():
  with open(RESULT) as f:
    result = json.load(f)
  assert result["peer"]["commit"].startswith("7dbdd08bdb27")
  compared = declared = 0
  for case in result["cases"]:
    r = peer_rollouts(case)
    opts = MTGRPOOptions(credit="immediate", turn_reward="format", coef=case["coef"],
                         zscore=segments.ZScore(eps=1e-4))
    tokens, lm = np.asarray(advantages.get("mt_grpo")(r, opts).tokens), np.asarray(r.loss_mask)
    for b, (layout, want) in enumerate(zip(case["layout"], case["advantages"])):
      got = tokens[b][lm[b]]
      close = np.abs(got - np.asarray(want)) <= 1e-5 + 1e-5 * np.abs(want)
      if len(layout) == 3:
        assert close.all(), (case["seed"], b)
        compared += len(got)
      else:
        declared += int(not close.all())
  assert compared > 500 and declared > 0


@pytest.mark.parametrize("make, field", [
    (lambda: MTGRPOOptions(credit="per_turn"), "credit"),
    (lambda: MTGRPOOptions(turn_reward="solves"), "turn_reward"),
    (lambda: MTGRPOOptions(coef=-1.0), "coef"),
    (lambda: MTGRPOOptions(zscore=None), "zscore"),
    (lambda: MTGRPOOptions(matching="sinkhorn"), "matching"),
])
def test_invalid_options_name_the_option(make, field):
  with pytest.raises(ValueError, match=field):
    make()
