"""The random batch generator: Algorithm-1 tree shape, independent rollouts, `to_rollouts`."""

from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given, strategies as st

from tirjax.testing import synthetic


def tree_structure(paths: synthetic.Paths):
  """children of each node (root of query g: ("root", g)) and rows through each node."""
  children, rows = defaultdict(set), defaultdict(set)
  for b, (g, path, n) in enumerate(zip(paths.group_id, paths.node_id, paths.num_steps)):
    parent = ("root", int(g))
    for node in path[:n]:
      children[parent].add(int(node))
      rows[int(node)].add(b)
      parent = int(node)
  return children, rows


@given(st.lists(st.integers(1, 9), min_size=1, max_size=6), st.integers(1, 3),
       st.integers(1, 6), st.sampled_from([0.0, 0.3, 0.7, 1.0]), st.integers(0, 2**32 - 1))
def test_tree_paths_follow_algorithm_1(sizes, f, depth, finish, seed):
  p = synthetic.tree_paths(np.random.default_rng(seed), sizes, branching=f, max_depth=depth,
                           finish_prob=finish)
  np.testing.assert_array_equal(np.bincount(p.group_id, minlength=len(sizes)), sizes)
  assert np.all((p.num_steps >= 1) & (p.num_steps <= depth))
  # Rows cut at T_max are the unfinished ones.
  assert np.all(p.finished | (p.num_steps == depth))
  if finish == 1.0:
    assert np.all(p.num_steps == 1) and np.all(p.finished)
  if finish == 0.0:
    assert np.all(p.num_steps == depth) and not np.any(p.finished)
  children, rows = tree_structure(p)
  for g, n in enumerate(sizes):
    # First steps that kept no child were dropped; at most n remain.
    assert 1 <= len(children[("root", g)]) <= n
    if f == 1 and finish == 0.0:  # nothing to choose, nothing dropped: n separate chains
      assert len(children[("root", g)]) == n
  for node, kids in children.items():
    if not isinstance(node, tuple):
      assert len(kids) <= f  # each active node proposed f candidates
  # Exactly n − n_c candidates kept at each depth: the n rows end at n distinct leaves, and a
  # step that answered has no children.
  for b in range(len(p.group_id)):
    leaf = int(p.node_id[b, p.num_steps[b] - 1])
    assert rows[leaf] == {b} and not children[leaf]


def test_tree_paths_keep_candidates_uniformly():
  """n = 2, f = 2, no one finishes: at depth 2, 2 of 4 candidates are kept, both from the same
  parent with probability 2 / C(4, 2) = 1/3."""
  p = synthetic.tree_paths(np.random.default_rng(0), [2] * 6000, branching=2, max_depth=2,
                           finish_prob=0.0)
  same_parent = p.node_id[0::2, 0] == p.node_id[1::2, 0]
  assert abs(same_parent.mean() - 1 / 3) < 5 * np.sqrt(2 / 9 / 6000)


@given(st.lists(st.integers(1, 9), min_size=1, max_size=6), st.integers(1, 8),
       st.sampled_from([0.0, 0.4, 1.0]), st.integers(0, 2**32 - 1))
def test_independent_paths(sizes, depth, finish, seed):
  p = synthetic.independent_paths(np.random.default_rng(seed), sizes, max_depth=depth,
                                  finish_prob=finish)
  np.testing.assert_array_equal(np.bincount(p.group_id, minlength=len(sizes)), sizes)
  ids = p.node_id[p.node_id >= 0]
  assert len(np.unique(ids)) == ids.size == p.num_steps.sum()
  assert np.all(p.finished | (p.num_steps == depth))
  if finish == 1.0:
    assert np.all(p.num_steps == 1)


@given(st.sampled_from(["tree", "independent"]), st.sampled_from(["uniform", "levels", -0.2]),
       st.integers(0, 2**32 - 1))
def test_to_rollouts_draws_per_node_and_pads(kind, fm, seed):
  rng = np.random.default_rng(seed)
  make = synthetic.tree_paths if kind == "tree" else synthetic.independent_paths
  p = make(rng, rng.integers(1, 7, 4), max_depth=5)
  R = len(p.group_id)
  r = synthetic.to_rollouts(rng, p, format_reward=fm, num_rows=R + 3, max_steps=7,
                            max_calls=3, max_gt_calls=2)  # validated inside
  assert (r.num_rows, r.max_steps, r.max_calls, r.max_gt_calls) == (R + 3, 7, 3, 2)
  assert r.max_tokens == 2 + 7 * 3
  np.testing.assert_array_equal(r.row_valid, np.arange(R + 3) < R)
  out, sv = np.asarray(r.outcome), np.asarray(r.step_valid)
  np.testing.assert_array_equal(out[:R][~p.finished], -1.0)
  np.testing.assert_array_equal(r.answered[:R], p.finished)
  np.testing.assert_array_equal(r.answer_score, (out == 1.0) & np.asarray(r.row_valid))
  fr = np.asarray(r.format_reward)[sv]
  if fm == "levels":
    levels = 0.25 * (2 * np.arange(6) / 5 - 1)
    assert np.all(np.min(np.abs(fr[:, None] - levels[None, :]), axis=1) < 1e-6)
  elif fm == "uniform":
    assert np.all(np.abs(fr) <= 0.25)
  else:
    np.testing.assert_allclose(fr, fm, rtol=1e-6)
  # Rows that share a node share its step: format reward, calls and generated tokens.
  nid, fmr, calls = np.asarray(r.node_id), np.asarray(r.format_reward), np.asarray(r.call_valid)
  ts, tokens, logp = np.asarray(r.token_step), np.asarray(r.tokens), np.asarray(r.old_logprobs)
  by_node = {}
  for b, t in zip(*np.nonzero(sv)):
    step = (float(fmr[b, t]), calls[b, t].tobytes(), tokens[b][ts[b] == t].tobytes(),
            logp[b][ts[b] == t].tobytes())
    assert by_node.setdefault(int(nid[b, t]), step) == step
  # Every generated token belongs to a valid step of its row, two per step.
  np.testing.assert_array_equal(np.asarray(r.loss_mask).sum(1), 2 * np.asarray(r.num_steps))


def test_paper_scale_shapes():
  rng = np.random.default_rng(1)
  tree = synthetic.tree_rollouts(rng, [8] * 256)
  assert (tree.num_rows, tree.max_steps) == (2048, 6)
  flat = synthetic.independent_rollouts(rng, [16] * 256, max_depth=10)
  assert (flat.num_rows, flat.max_steps) == (4096, 10)


@pytest.mark.parametrize("call, field", [
    (lambda rng: synthetic.tree_paths(rng, [0, 3]), "group_sizes"),
    (lambda rng: synthetic.tree_paths(rng, [3], finish_prob=1.5), "finish_prob"),
    (lambda rng: synthetic.tree_paths(rng, [3], branching=0), "branching"),
    (lambda rng: synthetic.independent_paths(rng, [3], max_depth=0), "max_depth"),
    (lambda rng: synthetic.tree_rollouts(rng, [3], format_reward=0.5), "format_reward"),
    (lambda rng: synthetic.tree_rollouts(rng, [3], format_reward="gauss"), "format_reward"),
    (lambda rng: synthetic.tree_rollouts(rng, [3], outcome_probs=(0.5, 0.6, 0)),
     "outcome_probs"),
    (lambda rng: synthetic.tree_rollouts(rng, [3], num_rows=2), "num_rows"),
    (lambda rng: synthetic.tree_rollouts(rng, [3], max_depth=4, max_steps=3,
                                         finish_prob=0.0), "max_steps"),
])
def test_bad_arguments_name_themselves(call, field):
  with pytest.raises(ValueError, match=field):
    call(np.random.default_rng(0))
