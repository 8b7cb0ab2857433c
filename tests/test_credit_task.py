"""The chain task, its exact evaluation and the policy (tirjax.credit.task/evaluate/policy)."""

import dataclasses

import jax
import numpy as np
import pytest
from hypothesis import given, strategies as st

from tirjax.testing.reference import credit as reference
from tirjax.credit import evaluate, softmax_policy as policy
from tirjax.credit.task import ADVANCE, ANSWER_KIND, DETOUR, FATAL, ChainTask, transition
from tirjax.testing.chain_tasks import random_policy, tasks

KIND_NAMES = {ADVANCE: "advance", DETOUR: "detour", FATAL: "fatal", ANSWER_KIND: "answer"}


@given(tasks())
def test_kinds_follow_the_rules(task):
  cfg = dataclasses.asdict(task)
  kinds = task.kinds()
  for k in range(task.num_progress):
    for a in range(task.num_actions):
      assert KIND_NAMES[kinds[k, a]] == reference.action_kind(cfg, k, a)
    assert np.sum(kinds[k] == FATAL) == task.fatal[k]
    assert np.sum(kinds[k] == ADVANCE) == (k < task.num_stages)


@given(tasks(), st.integers(0, 2**32 - 1))
def test_exact_value_matches_backward_recursion(task, seed):
  probs = random_policy(np.random.default_rng(seed), task)
  got = evaluate.policy_value(task, probs)
  want = reference.value(dataclasses.asdict(task), probs.tolist())
  np.testing.assert_allclose(got["success"], want["success"], atol=1e-12)
  np.testing.assert_allclose(got["mean_outcome"], want["mean_outcome"], atol=1e-12)
  # The outcome distribution is a distribution.
  total = (got["success"] + got["early_answer_rate"] + got["fatal_rate"] + got["truncated_rate"])
  np.testing.assert_allclose(total, 1.0, atol=1e-12)
  assert 1.0 <= got["avg_steps"] <= task.max_steps + 1e-12


@given(tasks())
def test_optimal_policy_gets_the_optimal_return(task):
  v = evaluate.optimal_value(task)
  assert v["success"] == 1.0 and v["mean_outcome"] == 1.0
  assert v["avg_steps"] == task.num_stages + 1 and v["unanswerable_rate"] == 0.0
  # Nothing beats it: random policies (and deterministic ones) never exceed success 1.
  rng = np.random.default_rng(0)
  for _ in range(5):
    probs = random_policy(rng, task, 0.2)
    assert evaluate.policy_value(task, probs)["mean_outcome"] <= 1.0 + 1e-12
  replayed = reference.replay(dataclasses.asdict(task), task.optimal_action().tolist())
  assert replayed["outcome"] == 1.0 and replayed["answered"]


def test_greedy_probs_is_the_argmax_policy():
  task = ChainTask()
  logp = np.log(random_policy(np.random.default_rng(1), task))
  g = evaluate.greedy_probs(logp)
  assert np.all(g.sum(axis=1) == 1.0)
  assert np.all(np.argmax(g, axis=1) == np.argmax(logp, axis=1))
  greedy_opt = evaluate.greedy_probs(np.log(evaluate.optimal_probs(task) + 1e-3))
  assert evaluate.policy_value(task, greedy_opt)["success"] == 1.0


@given(tasks(), st.integers(0, 2**32 - 1))
def test_transition_matches_replay(task, seed):
  rng = np.random.default_rng(seed)
  cfg = dataclasses.asdict(task)
  progress = rng.integers(0, task.num_progress, 64)
  action = rng.integers(0, task.num_actions, 64)
  tr = transition(task, progress, action)
  for k, a, i in zip(progress, action, range(64)):
    kind = reference.action_kind(cfg, int(k), int(a))
    assert tr["progress"][i] == k + (kind == "advance")
    assert tr["done"][i] == (kind in ("answer", "fatal"))
    assert tr["answered"][i] == (kind == "answer")
    want = {"answer": 1.0 if k == task.num_stages else task.early_answer, "fatal": -1.0}
    assert tr["outcome"][i] == want.get(kind, 0.0)
    assert tr["format_reward"][i] == (task.fatal_format if kind == "fatal" else task.ok_format)


def test_warm_start_prior_and_uniform_initial_policy():
  task = ChainTask()
  for q in (1 / task.num_actions, 0.35, 0.9):
    opts = policy.PolicyOptions(warm_start=q)
    params = policy.init_policy(jax.random.PRNGKey(0), task, opts)
    table = np.exp(np.asarray(policy.log_policy(params, policy.state_features(task),
                                                policy.prior_logits(task, opts))))
    np.testing.assert_allclose(table.sum(axis=1), 1.0, rtol=1e-6)
    best = evaluate.optimal_probs(task).astype(bool)
    np.testing.assert_allclose(table[best], q, rtol=1e-5)
    np.testing.assert_allclose(table[~best], (1 - q) / (task.num_actions - 1), rtol=1e-5)


@pytest.mark.parametrize("kwargs, name", [
    (dict(num_stages=0), "num_stages"), (dict(num_actions=4), "num_actions"),
    (dict(fatal=(1, 1)), "fatal"), (dict(fatal=(0, 9, 0, 0)), "fatal"),
    (dict(max_steps=3), "max_steps"), (dict(early_answer=0.5), "early_answer"),
    (dict(ok_format=0.3), "ok_format"), (dict(fatal_format=-1.0), "fatal_format")])
def test_task_rejects_bad_options_by_name(kwargs, name):
  with pytest.raises(ValueError, match=name):
    ChainTask(**kwargs)


@pytest.mark.parametrize("kwargs, name", [(dict(hidden=(0,)), "hidden"),
                                          (dict(warm_start=1.0), "warm_start"),
                                          (dict(warm_start=0.0), "warm_start")])
def test_policy_rejects_bad_options_by_name(kwargs, name):
  with pytest.raises(ValueError, match=name):
    policy.PolicyOptions(**kwargs)


def test_policy_value_rejects_a_wrong_shape():
  with pytest.raises(ValueError, match="probs"):
    evaluate.policy_value(ChainTask(), np.ones((3, 3)))
