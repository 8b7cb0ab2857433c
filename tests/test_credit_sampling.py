"""Chain-task rollouts (tirjax.credit.chain_rollouts): validated batches, Algorithm-1 invariants, and
every row's fields replayed against the reference task."""

import collections
import dataclasses

import numpy as np
import pytest
from hypothesis import given, strategies as st

from tirjax.testing.reference import credit as reference
from tirjax.credit import chain_rollouts, evaluate
from tirjax.credit.task import ADVANCE, ANSWER_KIND, FATAL, ChainTask
from tirjax.testing.chain_tasks import random_policy, tasks


@st.composite
def setups(draw):
  task = draw(tasks())
  opts = chain_rollouts.ChainRolloutOptions(kind=draw(st.sampled_from(chain_rollouts.KINDS)),
                                 group_size=draw(st.integers(1, 8)),
                                 branching=draw(st.integers(1, 3)),
                                 num_queries=draw(st.integers(1, 4)))
  return task, opts, draw(st.integers(0, 2**32 - 1))


def sample(task, opts, seed, probs=None):
  rng = np.random.default_rng(seed)
  probs = random_policy(rng, task, 0.7) if probs is None else probs
  log_probs = np.log(probs)
  return chain_rollouts.sample_batch(rng, task, log_probs, opts), log_probs


def tree_of(node_id, group_id):
  """children[parent] per group (the root is ("root", g)), nodes' depths and rows through them."""
  children, rows = collections.defaultdict(set), collections.defaultdict(set)
  for b in range(node_id.shape[0]):
    parent = ("root", int(group_id[b]))
    for t in range(node_id.shape[1]):
      n = int(node_id[b, t])
      if n < 0:
        break
      children[parent].add(n)
      rows[n].add(b)
      parent = n
  return children, rows


@given(setups())
def test_rows_replay_to_the_same_fields(setup):
  task, opts, seed = setup
  batch, log_probs = sample(task, opts, seed)  # sample_batch validates the batch
  r = {k: np.asarray(v) for k, v in vars(batch.rollouts).items()
       if isinstance(v, (np.ndarray,)) or hasattr(v, "shape")}
  cfg = dataclasses.asdict(task)
  states = np.asarray(batch.states)
  assert r["tokens"].shape == (opts.num_queries * opts.group_size, task.max_steps)
  for b in range(r["tokens"].shape[0]):
    n = int(r["num_steps"][b])
    actions = r["tokens"][b, :n].tolist()
    want = reference.replay(cfg, actions)
    assert r["outcome"][b] == want["outcome"] and r["answered"][b] == want["answered"]
    np.testing.assert_allclose(r["format_reward"][b, :n], want["format_reward"], rtol=1e-6)
    assert states[b, :n].tolist() == want["states"]
    np.testing.assert_allclose(r["old_logprobs"][b, :n], log_probs[want["states"], actions],
                               rtol=1e-6)
    assert r["token_step"][b, :n].tolist() == list(range(n))
    assert np.all(r["token_step"][b, n:] == -1) and np.all(states[b, n:] == 0)
    calls = [a != 0 for a in actions]
    assert r["call_valid"][b, :n, 0].tolist() == calls
    assert r["call_solves"][b, :n, 0].tolist() == [c and s for c, s in
                                                     zip(calls, want["solves"])]
    for t, a in enumerate(actions):
      want_sim = [float(calls[t] and a == c + 1) for c in range(task.num_stages)]
      assert r["call_sim"][b, t, 0].tolist() == want_sim
    assert r["answer_score"][b] == (want["outcome"] == 1.0)
  assert np.all(r["num_expected"] == task.num_stages)


@given(setups())
def test_algorithm_1_invariants(setup):
  task, opts, seed = setup
  batch, _ = sample(task, opts, seed)
  r = batch.rollouts
  node_id, group_id = np.asarray(r.node_id), np.asarray(r.group_id)
  num_steps, tokens = np.asarray(r.num_steps), np.asarray(r.tokens)
  n, f = opts.group_size, opts.branching if opts.kind == "tree" else 1
  assert np.all(np.bincount(group_id, minlength=opts.num_queries) == n)
  children, _ = tree_of(node_id, group_id)
  kinds = task.kinds()
  for g in range(opts.num_queries):
    assert 1 <= len(children[("root", g)]) <= n  # n first steps, some maybe dropped later
  for b in range(node_id.shape[0]):
    progress = 0
    for t in range(int(num_steps[b])):
      node = int(node_id[b, t])
      if t > 0:
        assert len(children[int(node_id[b, t - 1])]) <= f  # f candidates per node
      kind = kinds[progress, tokens[b, t]]
      progress += kind == ADVANCE
      terminal = kind in (FATAL, ANSWER_KIND)
      last = t == num_steps[b] - 1
      assert not terminal or last  # a terminal step ends its row
      assert terminal or not last or t == task.max_steps - 1  # else the row ran to T_max
      # A kept node is terminal, at T_max, or has a kept child (else it would be dropped).
      assert terminal or t == task.max_steps - 1 or children[node], (b, t)
  # Sampling cost: n first steps, then f candidates for every row still active at each depth.
  active = [(num_steps > d).sum() for d in range(1, task.max_steps)]
  assert batch.num_samples == n * opts.num_queries + f * int(np.sum(active))


@given(setups())
def test_independent_rollouts_share_nothing(setup):
  task, opts, seed = setup
  batch, _ = sample(task, dataclasses.replace(opts, kind="independent"), seed)
  node_id = np.asarray(batch.rollouts.node_id)
  ids = node_id[node_id >= 0]
  assert ids.size == np.unique(ids).size  # every step its own node: the root is the only fork


def test_rows_cut_at_t_max_are_unanswered_failures():
  task = ChainTask()
  batch, _ = sample(task, chain_rollouts.ChainRolloutOptions(num_queries=32), 3)
  r = batch.rollouts
  kinds, states = task.kinds(), np.asarray(batch.states)
  cut = 0
  for b in range(r.num_rows):
    last = int(r.num_steps[b]) - 1
    if kinds[states[b, last] // task.max_steps, int(r.tokens[b, last])] not in (FATAL, ANSWER_KIND):
      assert last == task.max_steps - 1
      assert not bool(r.answered[b]) and float(r.outcome[b]) == -1.0
      cut += 1
  assert cut > 0  # the random policy detours often enough to hit T_max


def test_optimal_policy_rollouts_all_succeed():
  task = ChainTask()
  with np.errstate(divide="ignore"):
    log_probs = np.log(evaluate.optimal_probs(task))
  for kind in chain_rollouts.KINDS:
    batch = chain_rollouts.sample_batch(np.random.default_rng(0), task, log_probs,
                                  chain_rollouts.ChainRolloutOptions(kind=kind))
    r = batch.rollouts
    assert np.all(np.asarray(r.outcome) == 1.0)
    assert np.all(np.asarray(r.num_steps) == task.num_stages + 1)
    assert np.all(np.asarray(r.old_logprobs) == 0.0)


@pytest.mark.parametrize("kwargs, name", [(dict(kind="forest"), "kind"),
                                          (dict(group_size=0), "group_size"),
                                          (dict(branching=0), "branching"),
                                          (dict(num_queries=0), "num_queries")])
def test_rollout_options_reject_bad_values_by_name(kwargs, name):
  with pytest.raises(ValueError, match=name):
    chain_rollouts.ChainRolloutOptions(**kwargs)
