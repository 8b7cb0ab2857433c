"""Unlearning diagnostic (spec §4.1) and PORTool's Theorem 3.1 as tests."""

import jax
import numpy as np
from hypothesis import given, strategies as st

from tirjax.rollouts import to_numpy
from tirjax.testing.strategies import SHAPE, tree_batches
from tirjax.testing.reference import unlearning as reference
from tirjax import advantages
from tirjax.testing import synthetic
from tirjax.advantages import unlearning
from tirjax.advantages.portool import PORToolOptions
from tirjax.loss.aggregation import AGGREGATIONS
from tirjax.testing.records import GroupRecord, RowRecord, StepRecord, build_rollouts

necessary_steps = jax.jit(unlearning.necessary_steps)
unlearning_rate = unlearning.unlearning_rate
PORTOOL = advantages.get("portool")
GRPO = advantages.get("grpo")


@given(tree_batches(), st.integers(0, 2**32 - 1), st.sampled_from(AGGREGATIONS),
       st.booleans())
def test_matches_reference(r, seed, aggregation, masked):
  batch = to_numpy(r)
  np.testing.assert_array_equal(necessary_steps(r), reference.necessary_steps(batch))
  rng = np.random.default_rng(seed)
  adv = rng.normal(size=r.step_valid.shape).astype(np.float32)
  row_mask = rng.random(r.num_rows) < 0.7 if masked else None
  want = reference.unlearning_rate(batch, adv.astype(np.float64), aggregation, row_mask)
  # A net push within float32 rounding of 0 (but not exactly 0, as with no weight at all) may
  # take either sign: leave such trees out (continuous advantages make them rare).
  if any(0 < abs(p) < 1e-5 for p in want["pushes"].values()):
    return
  got = unlearning_rate(r, adv, aggregation, row_mask)
  assert int(got["num_necessary"]) == want["num_necessary"]
  assert int(got["num_negative"]) == want["num_negative"]
  np.testing.assert_allclose(got["rate"], want["rate"], rtol=1e-6)
  np.testing.assert_allclose(got["row_rate"], want["row_rate"], rtol=1e-6)


def lengths_tree():
  """root ─┬─ a ─┬─ a1 (10 tokens)   row 0, R_out +1: |τ| = 11
           │     ├─ a2 (1 token)    row 1, R_out −1: |τ| = 2
           │     └─ a3 (1 token)    row 2, R_out −1: |τ| = 2
           └─ b                     row 3, R_out −1

  GRPO: z = (1.5, −0.5, −0.5, −0.5). a is necessary; the mean of its rows' advantages is
  +1/6, but under seq_mean_token_mean its tokens weigh 1/11 in row 0 and 1/2 in rows 1-2:
  net push 1.5/11 − 0.5/2 − 0.5/2 < 0, so the update pushes a's token down.
  """
  rows = [RowRecord(steps=[StepRecord(node="a"), StepRecord(node="a1", tokens=(1,) * 10)],
                    outcome=1)]
  rows += [RowRecord(steps=[StepRecord(node="a"), StepRecord(node=f"a{i}")], outcome=-1)
           for i in (2, 3)]
  rows.append(RowRecord(steps=[StepRecord(node="b")], outcome=-1))
  return build_rollouts([GroupRecord(rows=rows)], num_rows=SHAPE[0], max_steps=SHAPE[1],
                        max_calls=2, max_gt_calls=2, max_tokens=20)


def test_net_push_follows_the_loss_aggregation():
  r = lengths_tree()
  grpo = GRPO(r)
  np.testing.assert_allclose(np.asarray(grpo.rows)[:4], [1.5, -0.5, -0.5, -0.5], atol=1e-5)
  per_row = unlearning_rate(r, grpo.steps, "seq_mean_token_mean")
  per_token = unlearning_rate(r, grpo.steps, "token_mean")
  assert (int(per_row["num_necessary"]), int(per_row["num_negative"])) == (2, 1)
  assert (int(per_token["num_necessary"]), int(per_token["num_negative"])) == (2, 0)
  # Rows outside the loss weigh nothing: without rows 1-2, a's push is row 0's alone.
  keep = np.ones(SHAPE[0], bool)
  keep[1:3] = False
  assert int(unlearning_rate(r, grpo.steps, "seq_mean_token_mean", keep)["num_negative"]) == 0


@given(tree_batches())
def test_portool_own_and_mean_push_alike_under_token_mean(r):
  """spec §4.1: `shared_step_trj="own"` only moves the trajectory term between the rows of a
  step, so when every row's tokens weigh the same the net push, and the rate, are "mean"'s."""
  mean = PORTOOL(r)
  own = PORTOOL(r, PORToolOptions(shared_step_trj="own"))
  w = unlearning.step_loss_weights(r, "token_mean")
  push = lambda a: np.asarray(jax.ops.segment_sum(
      (w * a.steps).ravel(), np.where(r.step_valid, r.node_id, 0).ravel(), r.num_rows * r.max_steps))
  np.testing.assert_allclose(push(own), push(mean), atol=1e-4)


def theorem_tree():
  """root ─┬─ a ─┬─ a1    row 0, R_out +1, T = 2
           │     ├─ a2    rows 1-3, R_out −1, T = 2
           │     ├─ a3
           │     └─ a4
           └─ b           row 4, R_out 0, T = 1

  a is necessary (the only correct leaf lies below it), and so is a1.
  """
  rows = [RowRecord(steps=[StepRecord(node="a"), StepRecord(node=f"a{i}")],
                    outcome=1 if i == 1 else -1) for i in range(1, 5)]
  rows.append(RowRecord(steps=[StepRecord(node="b")], outcome=0))
  return build_rollouts([GroupRecord(rows=rows)], num_rows=SHAPE[0], max_steps=SHAPE[1],
                        max_calls=2, max_gt_calls=2)


def test_theorem_3_1_grpo_unlearns_a_necessary_step_portool_does_not():
  r = theorem_tree()
  want = np.zeros(SHAPE, bool)
  want[:4, 0] = True  # a, on every row through it
  want[0, 1] = True  # a1
  np.testing.assert_array_equal(necessary_steps(r), want)
  # GRPO: R_out = (1, −1, −1, −1, 0), mean −0.4, std 0.894427:
  # z = (1.565248, −0.670820 ×3, 0.447214); a carries rows 0-3: mean −0.111803 < 0.
  grpo = GRPO(r)
  np.testing.assert_allclose(np.asarray(grpo.steps)[:4, 0].mean(), -0.111803, atol=1e-5)
  rate = unlearning_rate(r, grpo.steps)
  assert (int(rate["num_necessary"]), int(rate["num_negative"])) == (2, 1)
  np.testing.assert_allclose(rate["rate"], 0.5)
  # PORTool: R(a) = γ + 0.25 = 1.2 > R(b) = 0 + 0.25 → A_fork(a) = 1/√2; n_forks = 2 so
  # κ(root) = 5/(5·2) = 0.5: A(a) = −0.111803 + 0.5 · 0.707107 = 0.241750 ≥ 0.
  portool = PORTOOL(r)
  np.testing.assert_allclose(np.asarray(portool.steps)[:4, 0], 0.241750, atol=2e-5)
  rate = unlearning_rate(r, portool.steps)
  assert int(rate["num_negative"]) == 0 and float(rate["rate"]) == 0.0


@given(tree_batches())
def test_portool_without_trajectory_term_never_unlearns(r):
  """ω1 = 0: a necessary step is the strict best child of its fork (its max outcome term is
  ≥ γ^5 > 0.5 above any sibling's, more than R_fm can undo), so A_fork > 0."""
  out = PORTOOL(r, PORToolOptions(omega1=0.0))
  rate = unlearning_rate(r, out.steps)
  assert int(rate["num_negative"]) == 0 and float(rate["row_rate"]) == 0.0


def test_no_necessary_step_gives_rate_zero():
  r = build_rollouts([GroupRecord(rows=[RowRecord(steps=[StepRecord()], outcome=-1)] * 3)],
                     num_rows=SHAPE[0], max_steps=SHAPE[1], max_calls=2, max_gt_calls=2)
  rate = unlearning_rate(r, GRPO(r).steps)
  assert int(rate["num_necessary"]) == 0
  assert float(rate["rate"]) == 0.0 and float(rate["row_rate"]) == 0.0


def test_random_trees_portool_unlearns_far_less_than_grpo():
  """spec §4.1: on random Algorithm-1 trees PORTool's rate is far below GRPO's, and with
  `shared_step_trj="own"` the rows carrying a necessary step often push it down."""
  r = synthetic.tree_rollouts(np.random.default_rng(0), [8] * 256, outcome_probs=(0.3, 0.1, 0.6))
  rates = {name: unlearning_rate(r, est.steps) for name, est in [
      ("grpo", GRPO(r)), ("portool", PORTOOL(r)),
      ("own", PORTOOL(r, PORToolOptions(shared_step_trj="own")))]}
  assert int(rates["grpo"]["num_necessary"]) > 100
  assert int(rates["grpo"]["num_negative"]) > 0
  assert float(rates["portool"]["rate"]) <= 0.5 * float(rates["grpo"]["rate"])
  assert float(rates["portool"]["row_rate"]) <= 0.5 * float(rates["grpo"]["row_rate"])
  assert float(rates["own"]["row_rate"]) >= 4 * float(rates["portool"]["row_rate"]) + 0.05
