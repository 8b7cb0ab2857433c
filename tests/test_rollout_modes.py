"""Rollout modes: PORTool tree invariants over many random runs, ARPO branching and budget, and
every registered estimator on episode batches."""

import collections

import numpy as np
import pytest

from tirjax import advantages
from tirjax.env.toolworld import Difficulty, make_demos, make_tasks
from tirjax.episodes import (ArpoOptions, RolloutOptions, Shapes, TreeOptions, rollout,
                           time_modes)
from tirjax.rollouts import validate
from tirjax.testing.bookkeeping import check_bookkeeping
from tirjax.testing.estimator_checks import with_needed_fields
from tirjax.testing.scripted_samplers import RandomSampler, ScriptedSampler, distinct_questions

pytestmark = pytest.mark.slow  # left out of `make test-fast`

SHAPES = Shapes(num_rows=64, max_steps=6, max_calls=4, max_gt_calls=8, max_tokens=1024,
                max_params=4)


@pytest.fixture(scope="module")
def tasks():
  return distinct_questions(make_tasks("train", 96, seed=5, difficulty=Difficulty(
      hop_weights=(1, 1, 2, 2), p_down=0.2)), 48)


@pytest.fixture(scope="module")
def demos(tasks):
  return make_demos(tasks, seed=1)


def _arrays(r):
  return {k: np.asarray(getattr(r, k)) for k in ("node_id", "step_valid", "group_id",
                                                 "row_valid", "tokens", "token_step",
                                                 "token_valid", "num_steps")}


def check_tree(batch, n: int, f: int) -> None:
  """The invariants of PORTool's Algorithm 1 on one batch (see the test's docstring)."""
  validate(batch.rollouts)
  a = _arrays(batch.rollouts)
  rows = np.flatnonzero(a["row_valid"])
  # exactly n finished-or-truncated rows per query
  assert np.bincount(a["group_id"][rows]).tolist() == [n] * (a["group_id"][rows].max() + 1)
  assert all(e.status in ("answered", "max_steps", "truncated") for e in batch.episodes)
  # a node id lives at one depth; the runner's node uids and the batch ids agree
  depth_of, uid_of = {}, {}
  for rec in batch.episodes:
    for t, uid in enumerate(rec.node_uids):
      nid = int(a["node_id"][rec.row, t])
      assert depth_of.setdefault(nid, t) == t
      assert uid_of.setdefault(nid, uid) == uid
  assert len(set(uid_of.values())) == len(uid_of)
  # at most f children per node below the root, at most n below the root
  children = collections.defaultdict(set)
  for b in rows:
    for t in range(a["num_steps"][b]):
      parent = ("root", int(a["group_id"][b])) if t == 0 else int(a["node_id"][b, t - 1])
      children[parent].add(int(a["node_id"][b, t]))
  assert all(len(c) <= (n if isinstance(p, tuple) else f) for p, c in children.items())
  # rows through a node share its tokens exactly (and the tool response if both go on)
  def step_end(b, t):
    return int(np.flatnonzero(a["token_step"][b] == t)[-1]) + 1

  by_node = collections.defaultdict(list)
  for b in rows:
    for t in range(a["num_steps"][b]):
      by_node[int(a["node_id"][b, t])].append((b, t))
  for members in by_node.values():
    (b0, t), rest = members[0], members[1:]
    end = step_end(b0, t)
    for b, _ in rest:
      assert step_end(b, t) == end
      assert np.array_equal(a["tokens"][b, :end], a["tokens"][b0, :end])
      if a["num_steps"][b] > t + 1 and a["num_steps"][b0] > t + 1:
        nxt = int(np.flatnonzero(a["token_step"][b] == t + 1)[0])
        assert nxt == int(np.flatnonzero(a["token_step"][b0] == t + 1)[0])
        assert np.array_equal(a["tokens"][b, :nxt], a["tokens"][b0, :nxt])
  # the trace: f candidates per active node, exactly n − n_c chosen, the rest in no row
  in_rows = {uid for rec in batch.episodes for uid in rec.node_uids}
  chosen_at = {}
  for e in batch.trace:
    cands = dict(e["candidates"])
    chosen = set(e["chosen"])
    assert chosen <= set(cands) and len(chosen) == n - e["finished"]
    if e["depth"] == 0:
      assert len(cands) == n
    else:
      per_parent = collections.Counter(cands.values())
      assert set(per_parent.values()) == {f}
    assert not (set(cands) - chosen) & in_rows, "a dropped candidate is in a row"
    for uid in chosen:
      chosen_at[uid] = (e["query"], e["depth"])
  parents_with_children = {p for e in batch.trace for uid, p in e["candidates"]
                           if uid in set(e["chosen"])}
  proposers = {p for e in batch.trace for _, p in e["candidates"] if p is not None}
  dropped_nodes = proposers - parents_with_children
  assert not dropped_nodes & in_rows, "a node without a chosen child is in a row"
  assert in_rows <= set(chosen_at)


@pytest.mark.parametrize("run", range(24))
def test_tree_invariants_on_random_runs(tokenizer, tasks, demos, run):
  """Exactly n finished-or-truncated rows per query; no node with more than f children; rows
  sharing a node share its tokens; node depth = step index; dropped candidates and nodes left
  without a chosen child appear in no row; `validate` passes; token bookkeeping holds."""
  rng = np.random.default_rng(run)
  n, f, t_max = int(rng.integers(2, 9)), int(rng.integers(1, 4)), int(rng.integers(2, 7))
  q = int(rng.integers(1, SHAPES.num_rows // n + 1))
  chunk = [tasks[i] for i in rng.choice(len(tasks), size=min(q, 8), replace=False)]
  if run % 4 == 3:
    sampler = RandomSampler(tokenizer, p_stop=0.7)
  else:
    sampler = ScriptedSampler(tokenizer, tasks, demos, p_corrupt=float(rng.uniform(0, 0.5)),
                              p_early=float(rng.uniform(0, 0.4)))
  opts = RolloutOptions(mode="tree", n=n, max_steps=t_max, max_new_tokens=128, seed=run,
                        tree=TreeOptions(branch_factor=f), shapes=SHAPES)
  batch = rollout(sampler, tokenizer, chunk, opts)
  check_tree(batch, n, f)
  check_bookkeeping(batch, chunk, sampler, tokenizer, opts)


def test_trees_do_branch_below_the_root(tokenizer, tasks, demos):
  """Shared prefixes are real: many rows share nodes at depth >= 1 on these runs."""
  sampler = ScriptedSampler(tokenizer, tasks, demos, p_corrupt=0.3, p_early=0.2)
  opts = RolloutOptions(mode="tree", n=8, max_new_tokens=128, shapes=SHAPES)
  batch = rollout(sampler, tokenizer, tasks[:8], opts)
  nid = np.asarray(batch.rollouts.node_id)[:, 0]
  shared = sum(c > 1 for c in collections.Counter(nid[nid >= 0].tolist()).values())
  assert shared >= 4
  dropped = sum(len(e["candidates"]) - len(e["chosen"]) for e in batch.trace)
  assert dropped > 0


# -- ARPO ----------------------------------------------------------------------------------


def _arpo(tokenizer, tasks, demos, entropy, beam=2, tau=0.0, w=10.0, total=16, initial=8,
          seed=0, top_k=0):
  sampler = ScriptedSampler(tokenizer, tasks, demos, p_corrupt=0.1, entropy=entropy,
                            top_k=top_k)
  opts = RolloutOptions(mode="arpo", max_new_tokens=128, seed=seed, shapes=SHAPES,
                        arpo=ArpoOptions(initial_rollouts=initial, total_rollouts=total,
                                         beam_size=beam, branch_probability=tau,
                                         entropy_weight=w))
  chunk = [t for t in tasks if t.metadata["hops"] >= 3][:SHAPES.num_rows // total]
  return rollout(sampler, tokenizer, chunk, opts), chunk, sampler, opts


@pytest.mark.parametrize("beam", [2, 3])
def test_arpo_branches_where_entropy_rises_within_the_budget(tokenizer, tasks, demos, beam):
  batch, chunk, sampler, opts = _arpo(tokenizer, tasks, demos, lambda t: 0.0 if t == 0 else 3.0,
                                      beam=beam)
  validate(batch.rollouts)
  check_bookkeeping(batch, chunk, sampler, tokenizer, opts)
  groups = np.asarray(batch.rollouts.group_id)[np.asarray(batch.rollouts.row_valid)]
  assert np.bincount(groups).tolist() == [16] * len(chunk)  # ≤ 16, filled by restarts
  made = collections.Counter()
  for e in batch.trace:
    room = 16 - 8 - made[e["query"]]
    for _, delta, copies in e["sources"]:
      assert 0 <= copies <= beam - 1
      if delta > 0:  # u − w·ΔH ≤ 0 for every u: branches while the budget lasts
        assert copies == min(beam - 1, room)
      else:
        assert copies == 0
      room -= copies
      made[e["query"]] += copies
  assert sum(made.values()) > 0
  assert all(m <= 16 - 8 for m in made.values())
  # a copy shares its source's nodes: below the first step some node has 2+ rows
  nid = np.asarray(batch.rollouts.node_id)
  assert any(c > 1 for c in collections.Counter(nid[:, 0][nid[:, 0] >= 0].tolist()).values())


def test_arpo_does_not_branch_where_entropy_falls(tokenizer, tasks, demos):
  batch, chunk, _, _ = _arpo(tokenizer, tasks, demos, lambda t: 3.0 if t == 0 else 0.0)
  assert all(c == 0 for e in batch.trace for _, _, c in e["sources"])
  assert sum(e["restarts"] for e in batch.trace) == 8 * len(chunk)  # the budget is refilled
  nid = np.asarray(batch.rollouts.node_id)
  assert len(set(nid[:, 0][nid[:, 0] >= 0].tolist())) == 16 * len(chunk)  # no shared step


def test_arpo_uses_top_logprobs_when_the_sampler_gives_no_entropies(tokenizer, tasks, demos):
  batch, chunk, sampler, opts = _arpo(tokenizer, tasks, demos, None, tau=0.5, w=0.2, top_k=5)
  assert all(p.top_logprobs == 10 for _, p, _ in sampler.calls)
  deltas = [d for e in batch.trace for _, d, _ in e["sources"]]
  assert deltas and all(np.isfinite(deltas)) and any(d != 0 for d in deltas)
  validate(batch.rollouts)


# -- every estimator on episode batches ------------------------------------------------------


@pytest.fixture(scope="module")
def episode_batches(tokenizer, tasks, demos):
  out = {}
  for mode in ("independent", "tree", "arpo"):
    sampler = ScriptedSampler(tokenizer, tasks, demos, p_corrupt=0.25, p_early=0.25,
                              entropy=lambda t: float(t))
    opts = RolloutOptions(mode=mode, n=8, max_new_tokens=128, shapes=SHAPES,
                          arpo=ArpoOptions(initial_rollouts=4, total_rollouts=8))
    out[mode] = rollout(sampler, tokenizer, tasks[8:16], opts).rollouts
  return out


@pytest.mark.parametrize("name", advantages.names())
def test_every_registered_estimator_runs_on_episode_batches(episode_batches, name):
  est = advantages.get(name)
  for mode, r in episode_batches.items():
    r = with_needed_fields(est, r)
    out = est(r)
    tokens = np.asarray(out.tokens)
    assert tokens.shape == r.tokens.shape and np.isfinite(tokens).all(), (name, mode)
    assert not tokens[~np.asarray(r.loss_mask)].any(), (name, mode)
    assert np.isfinite(np.asarray(out.steps)).all() and np.isfinite(np.asarray(out.rows)).all()


def test_time_modes_reports_both_modes_at_equal_n(tokenizer, tasks, demos):
  sampler = ScriptedSampler(tokenizer, tasks, demos, p_corrupt=0.2, p_early=0.2)
  opts = RolloutOptions(n=4, max_new_tokens=128, shapes=SHAPES)
  out = time_modes(sampler, tokenizer, tasks[:4], opts, repeats=2, warmup=0)
  assert set(out) == {"tree", "independent"}
  for mode, stats in out.items():
    assert stats["rows"] == 16 and len(stats["wall_s_all"]) == 2
    assert stats["sampler_calls"] >= 1 and stats["sampled_tokens"] > 0, mode
    assert stats["wall_s"] == sorted(stats["wall_s_all"])[0] + (
        sorted(stats["wall_s_all"])[1] - sorted(stats["wall_s_all"])[0]) / 2
