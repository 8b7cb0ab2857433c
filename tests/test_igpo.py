"""IGPO (spec §4.4): the kernel against its loop reference on ragged random batches, a worked
group, the telescoping of the information gains, degenerate pools and its options' checks."""

import math

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, strategies as st

from tirjax import advantages, segments
from tirjax.advantages.igpo import IGPOOptions
from tirjax.rollouts import RolloutsError, validate
from tirjax.testing.estimator_checks import check_padding, check_reference, check_row_permutation
from tirjax.testing.records import GroupRecord, RowRecord, StepRecord, build_rollouts
from tirjax.testing.strategies import tree_batches

IGPO = advantages.get("igpo")
VARIANTS = (("igpo", IGPOOptions()),
            ("igpo", IGPOOptions(gamma=0.9, normalise="turn_index")),
            ("igpo", IGPOOptions(gamma=0.0, final_reward="answer_score",
                                 zscore=segments.ZScore(ddof=0))),
            ("igpo", IGPOOptions(gamma=0.5, zscore=segments.ZScore(scale="none",
                                                                   singleton="raw"))))


def with_answer_logprob(r, seed: int, kind: str):
  """`r` with one random answer log-probability per tree node: "random" (exponential), "equal"
  (every probe alike: zero gains), "tiny" (exp underflows to 0)."""
  rng = np.random.default_rng(seed)
  node, valid = np.asarray(r.node_id), np.asarray(r.step_valid)
  per_node = {"random": -rng.exponential(1.0, r.num_rows * r.max_steps),
              "equal": np.full(r.num_rows * r.max_steps, -0.7),
              "tiny": -rng.uniform(200.0, 1e4, r.num_rows * r.max_steps)}[kind]
  lp = np.where(valid, per_node[np.clip(node, 0, None)], 0.0).astype(np.float32)
  return r.replace(answer_logprob=jnp.asarray(lp))


@given(tree_batches(), st.integers(0, 2**32 - 1), st.sampled_from(["random", "equal", "tiny"]))
def test_reference_row_permutation_and_padding(r, seed, kind):
  r = validate(with_answer_logprob(r, seed, kind))
  check_reference(r, VARIANTS)
  check_row_permutation(r, seed, ["igpo"])
  check_padding(r, seed, ["igpo"])


@given(tree_batches(), st.integers(0, 2**32 - 1))
def test_gains_telescope_and_no_discount_keeps_the_normalised_reward(r, seed):
  """Σ of a row's gains (all but its last turn) = P(before its last turn) − P(before its
  first); with γ = 0 each turn's advantage is its own normalised reward."""
  r = with_answer_logprob(r, seed, "random")
  out = IGPO(r, IGPOOptions(gamma=0.0))
  np.testing.assert_allclose(out.steps, out.extras["normalised_reward"], atol=1e-6)
  gains = np.asarray(out.extras["information_gain"]).sum(axis=1)
  lp, n = np.asarray(r.answer_logprob), np.asarray(r.num_steps)
  want = [math.exp(lp[b, k - 1]) - math.exp(lp[b, 0]) if k > 0 else 0.0
          for b, k in enumerate(n)]
  np.testing.assert_allclose(np.where(np.asarray(r.row_valid), gains, 0.0),
                             np.where(np.asarray(r.row_valid), want, 0.0), atol=1e-5)


def group(*rows):
  return [GroupRecord(gt_calls=[], rows=[
      RowRecord(outcome=o, steps=[StepRecord(answer_logprob=math.log(p)) for p in probes])
      for o, probes in rows])]


def test_worked_group():
  """Row A: two turns, P = 0.2 before the first, 0.6 before the second, R_out = +1; row B: one
  turn, R_out = −1. Rewards A: (0.6 − 0.2, 1) = (0.4, 1), B: (−1). Pooled over the group: mean
  0.4/3 = 0.1333, std (ddof 1) = sqrt((0.2667² + 0.8667² + 1.1333²) / 2) = 1.0263, so z =
  (0.2598, 0.8445) and (−1.1043); γ = 1: A's turns get (1.1043, 0.8445), B's −1.1043."""
  r = build_rollouts(group((1, (0.2, 0.6)), (-1, (0.3,))), with_answer_logprob=True)
  out = IGPO(r)
  np.testing.assert_allclose(out.steps, [[1.1043, 0.8445], [-1.1043, 0.0]], atol=1e-4)
  np.testing.assert_allclose(out.rows, [1.1043, -1.1043], atol=1e-4)
  per_index = IGPO(r, IGPOOptions(normalise="turn_index"))  # turn 0: z(0.4, −1); turn 1: alone
  np.testing.assert_allclose(per_index.steps, [[0.7071, 0.0], [-0.7071, 0.0]], atol=1e-4)


@pytest.mark.parametrize("normalise", ["group", "turn_index"])
def test_equal_rewards_give_exactly_zero(normalise):
  """Every probe alike (no gain) and every outcome 0: all rewards equal → exactly 0, no NaN."""
  r = build_rollouts(group((0, (0.5, 0.5, 0.5)), (0, (0.5,)), (0, (0.5, 0.5))),
                     with_answer_logprob=True)
  out = IGPO(r, IGPOOptions(normalise=normalise))
  assert not np.any(np.asarray(out.steps)) and not np.any(np.asarray(out.tokens))


def test_a_batch_without_the_probes_is_refused_naming_the_field():
  r = build_rollouts(group((1, (0.5,))))
  with pytest.raises(ValueError, match="answer_logprob"):
    IGPO(r)


def test_validation_names_a_bad_probe():
  r = build_rollouts(group((1, (0.5, 0.4))), with_answer_logprob=True)
  with pytest.raises(RolloutsError, match="answer_logprob"):
    validate(r.replace(answer_logprob=r.answer_logprob.at[0, 0].set(0.5)))  # P > 1
  with pytest.raises(RolloutsError, match="answer_logprob"):
    validate(r.replace(answer_logprob=r.answer_logprob.at[0, 1].set(-jnp.inf)))


@pytest.mark.parametrize("field, value", [("gamma", -0.1), ("gamma", 1.5),
                                          ("gamma", float("nan")), ("normalise", "batch"),
                                          ("final_reward", "f1")])
def test_a_bad_option_fails_naming_it(field, value):
  with pytest.raises(ValueError, match=field):
    IGPOOptions(**{field: value})


def test_a_config_on_an_environment_without_gold_answers_fails_before_compute(monkeypatch):
  """configs/estimator.py:igpo resolves on toolworld; on an environment whose tasks carry no
  gold answer (toolworld's entry with `gold_answers` off: bfcl and ftrl, the real ones, need
  a checkpoint or a data file before this check) the trainer refuses it before anything runs,
  naming the key and the environments that have them."""
  import dataclasses  # noqa: PLC0415
  from configs import estimator  # noqa: PLC0415
  from tirjax.env import registry  # noqa: PLC0415
  from tirjax.trainer import resolve  # noqa: PLC0415
  assert resolve.resolve(estimator.get_config("igpo,model=tiny")).estimator.name == "igpo"
  entry = registry.get("toolworld")
  monkeypatch.setitem(registry._REGISTRY, "toolworld",
                      dataclasses.replace(entry, gold_answers=False))
  with pytest.raises(resolve.ConfigError,
                     match=r"advantage\.name: advantage igpo scores .*env\.name='toolworld' has "
                           r"no gold answers.* environments with gold answers: doors, toolhop$"):
    resolve.resolve(estimator.get_config("igpo,model=tiny"))
