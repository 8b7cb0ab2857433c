"""Hypothesis strategies of random ragged rollout-tree batches, padded to one fixed `SHAPE`.

One shape, so that each kernel compiles once per option set and test session rather than once
per example (compilation dominates on 2 cores). Needs `hypothesis` (requirements-test.txt).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from hypothesis import strategies as st

from tirjax.rollouts import Rollouts
from tirjax.testing import synthetic

SHAPE = (24, 6)  # (B, T); K = C = 2 calls, L = 2 + 3T tokens
MAX_CALLS = MAX_GT_CALLS = 2


def general_paths(rng: np.random.Generator, group_sizes, max_depth: int,
                  share_prob: float = 0.6, empty_prob: float = 0.1) -> synthetic.Paths:
  """Trees of any shape: each row walks down from the root, at each depth joining an existing
  child (with `share_prob`) or opening a new one; rows may stop inside another row's path, and
  a row may have no step at all."""
  group_id, paths, num_steps, finished = [], [], [], []
  next_id = 0
  for g, n in enumerate(group_sizes):
    children = defaultdict(list)
    for _ in range(n):
      length = 0 if rng.random() < empty_prob else int(rng.integers(1, max_depth + 1))
      node, path = ("root",), []
      for _ in range(length):
        kids = children[node]
        if kids and rng.random() < share_prob:
          node = kids[rng.integers(len(kids))]
        else:
          children[node].append(next_id)
          node, next_id = next_id, next_id + 1
        path.append(node)
      group_id.append(g)
      paths.append(path + [-1] * (max_depth - length))
      num_steps.append(length)
      finished.append(length > 0 and rng.random() < 0.7)
  return synthetic.Paths(np.array(group_id), np.array(paths).reshape(len(paths), max_depth),
                         np.array(num_steps), np.array(finished, bool))


def mixed_rollouts(rng: np.random.Generator, trees=(5, 3), independent=(4, 1), general=(6,),
                   *, num_rows: int, max_depth: int = 4, **kwargs) -> Rollouts:
  """One batch of every kind of group: Algorithm-1 trees (f = 2), independent groups and
  irregular trees (`general_paths`: rows that end inside one another or carry no step), of
  these sizes, then padding rows (`synthetic.to_rollouts` kwargs: token layout, vocabulary)."""
  parts = [synthetic.tree_paths(rng, trees, branching=2, max_depth=max_depth, finish_prob=0.3),
           synthetic.independent_paths(rng, independent, max_depth=max_depth, finish_prob=0.5),
           general_paths(rng, general, max_depth)]
  groups = nodes = 0
  fields = {k: [] for k in synthetic.Paths._fields}
  for p in parts:
    fields["group_id"].append(p.group_id + groups)
    fields["node_id"].append(np.where(p.node_id >= 0, p.node_id + nodes, -1))
    fields["num_steps"].append(p.num_steps)
    fields["finished"].append(p.finished)
    groups += int(p.group_id.max()) + 1
    nodes += int(p.node_id.max(initial=-1)) + 1
  paths = synthetic.Paths(*(np.concatenate(fields[k]) for k in synthetic.Paths._fields))
  return synthetic.to_rollouts(rng, paths, num_rows=num_rows, max_steps=max_depth, **kwargs)


@st.composite
def group_sizes(draw, max_rows: int):
  sizes = draw(st.lists(st.integers(1, 8), min_size=1, max_size=8))
  total = np.cumsum(sizes)
  return sizes[:max(1, int(np.sum(total <= max_rows)))]


@st.composite
def tree_batches(draw, kinds=("algorithm1", "independent", "general")) -> Rollouts:
  """Random ragged batches of rollout trees, padded to `SHAPE`.

  Covers singleton groups, single-chain trees (n = 1 or f = 1), rows that all finish at step
  1 (finish_prob = 1), none that finish (0), dropped branches (f > 1), all-equal groups
  (one outcome, one format reward), groups whose turns are all right or all wrong
  (`turn_label`) and irregular trees (`general_paths`).
  """
  B, T = SHAPE
  kind = draw(st.sampled_from(kinds))
  sizes = draw(group_sizes(B))
  rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
  depth = draw(st.integers(1, T))
  finish = draw(st.sampled_from([0.0, 0.3, 0.6, 1.0]))
  if kind == "algorithm1":
    paths = synthetic.tree_paths(rng, sizes, branching=draw(st.integers(1, 3)),
                                 max_depth=depth, finish_prob=finish)
  elif kind == "independent":
    paths = synthetic.independent_paths(rng, sizes, max_depth=depth, finish_prob=finish)
  else:
    paths = general_paths(rng, sizes, depth)
  outcome_probs = draw(st.sampled_from([None, None, (1.0, 0.0, 0.0), (0.0, 0.0, 1.0),
                                        (0.4, 0.2, 0.4)]))
  format_reward = draw(st.sampled_from(["uniform", "levels", 0.25, -0.15]))
  right_prob = draw(st.sampled_from([None, None, 1.0, 0.0]))  # turn labels: all right / wrong
  return synthetic.to_rollouts(rng, paths, outcome_probs=outcome_probs,
                               format_reward=format_reward, num_rows=B, max_steps=T,
                               max_calls=MAX_CALLS, max_gt_calls=MAX_GT_CALLS,
                               right_prob=right_prob)
