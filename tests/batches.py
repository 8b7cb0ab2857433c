"""Random batches for property tests: hypothesis strategies, padding and row permutation.

Batches are padded to one fixed `SHAPE`, so each kernel compiles once per option set and test
session rather than once per example (compilation dominates on 2 cores).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

from tirjax.testing import synthetic
from tirjax.rollouts import Rollouts, validate

SHAPE = (24, 6)  # (B, T); K = C = 2 calls, L = 2 + 3T tokens
MAX_CALLS = MAX_GT_CALLS = 2

# Axes of each field, by size symbol (for padding); the SPEC §2 table.
AXES = {
    "group_id": "B", "row_valid": "B", "outcome": "B", "num_steps": "B", "answered": "B",
    "step_valid": "BT", "node_id": "BT", "format_reward": "BT", "call_valid": "BTK",
    "call_sim": "BTKC", "gt_valid": "BC", "answer_score": "B", "tokens": "BL",
    "token_valid": "BL", "loss_mask": "BL", "token_step": "BL", "old_logprobs": "BL",
    "policy_version": "B", "ref_logprobs": "BL", "call_solves": "BTK", "num_expected": "B",
    "greedy_outcome": "B", "state_id": "BT",
}
PAD_VALUE = {"node_id": -1, "token_step": -1, "state_id": -1}


def as_batch(r: Rollouts) -> dict[str, np.ndarray]:
  """The numpy arrays of a batch, the input of `tirjax.testing.reference` functions."""
  return {f.name: np.asarray(getattr(r, f.name)) for f in dataclasses.fields(r)
          if f.name in AXES and getattr(r, f.name) is not None}


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
  (one outcome, one format reward) and irregular trees (`general_paths`).
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
  return synthetic.to_rollouts(rng, paths, outcome_probs=outcome_probs,
                               format_reward=format_reward, num_rows=B, max_steps=T,
                               max_calls=MAX_CALLS, max_gt_calls=MAX_GT_CALLS)


def permute_rows(r: Rollouts, perm: np.ndarray) -> Rollouts:
  """The same batch with its rows reordered: row i of the result is row perm[i]."""
  assert r.calls is None, "permute_rows handles batches without call encodings"
  return r.replace(**{name: jnp.asarray(np.asarray(getattr(r, name))[perm])
                      for name in AXES if getattr(r, name, None) is not None})


def pad(r: Rollouts, rng: np.random.Generator, extra_rows: int, extra_steps: int = 0,
        extra_calls: int = 0, extra_gt: int = 0, extra_tokens: int = 0):
  """The batch with padding rows inserted at random positions and larger T, K, C, L.

  Padding rows get random in-range group ids. Returns (padded batch, index of each original
  row in it).
  """
  assert r.calls is None, "pad handles batches without call encodings"
  B, T, K, C, L = r.num_rows, r.max_steps, r.max_calls, r.max_gt_calls, r.max_tokens
  B2 = B + extra_rows
  rows = np.sort(rng.choice(B2, B, replace=False))
  new = {"B": B2, "T": T + extra_steps, "K": K + extra_calls, "C": C + extra_gt,
         "L": L + extra_tokens}
  fields = {}
  for name, axes in AXES.items():
    x = getattr(r, name, None)
    if x is None:
      continue
    x = np.asarray(x)
    out = np.full([new[a] for a in axes], PAD_VALUE.get(name, 0), x.dtype)
    if name == "group_id":
      out[:] = rng.integers(0, B2, B2)
    out[(rows,) + tuple(slice(0, n) for n in x.shape[1:])] = x
    fields[name] = jnp.asarray(out)
  return validate(r.replace(**fields)), rows


# -- Checks every estimator test runs (tests/test_*_estimators.py) ---------------------------

def option_fields(opts) -> dict:
  """An options dataclass as the keyword arguments of its loop reference."""
  return {f: getattr(opts, f) for f in opts.__dataclass_fields__}


def check_reference(r: Rollouts, variants, keys=("steps", "rows", "tokens"), atol: float = 2e-5,
                    rtol: float = 1e-5) -> None:
  """Each (name, options) of `variants` against `REFERENCES[name]` on `r`: every output the
  reference gives among `keys` (within `atol`, `rtol`); tokens, rows and row rewards finite."""
  from tirjax import advantages  # pylint: disable=import-outside-toplevel
  from tirjax.testing.reference import REFERENCES  # pylint: disable=import-outside-toplevel
  batch = as_batch(r)
  for name, opts in variants:
    out = advantages.get(name)(r, opts)
    ref = REFERENCES[name](batch, **option_fields(opts))
    for key in keys:
      if key in ref:
        np.testing.assert_allclose(getattr(out, key), ref[key], atol=atol, rtol=rtol,
                                   err_msg=f"{name} {key} {opts}")
    for x in (out.tokens, out.rows, out.row_reward):
      assert np.all(np.isfinite(np.asarray(x))), name


def check_row_permutation(r: Rollouts, seed: int, names, field: str = "steps") -> None:
  """Reordering the rows reorders each estimator's `field` (and its row mask) alike."""
  from tirjax import advantages  # pylint: disable=import-outside-toplevel
  perm = np.random.default_rng(seed).permutation(r.num_rows)
  moved = permute_rows(r, perm)
  for name in names:
    est = advantages.get(name)
    a, b = est(r), est(moved)
    np.testing.assert_allclose(getattr(b, field), np.asarray(getattr(a, field))[perm],
                               atol=1e-5, err_msg=name)
    np.testing.assert_array_equal(b.row_mask, np.asarray(a.row_mask)[perm], err_msg=name)


def check_padding(r: Rollouts, seed: int, names, field: str = "steps") -> None:
  """Padding rows, steps, calls, ground-truth slots and tokens change no estimator's `field`
  on the original rows, and the padding rows get nothing."""
  from tirjax import advantages  # pylint: disable=import-outside-toplevel
  big, rows = pad(r, np.random.default_rng(seed), extra_rows=5, extra_steps=2, extra_calls=1,
                  extra_gt=1, extra_tokens=3)
  rest = np.ones(big.num_rows, bool)
  rest[rows] = False
  for name in names:
    est = advantages.get(name)
    a, b = np.asarray(getattr(est(r), field)), est(big)
    got = np.asarray(getattr(b, field))[rows]
    np.testing.assert_allclose(got[(slice(None),) + tuple(slice(0, n) for n in a.shape[1:])], a,
                               atol=1e-5, err_msg=name)
    np.testing.assert_allclose(np.asarray(b.rows)[rows], est(r).rows, atol=1e-5, err_msg=name)
    assert not np.any(np.asarray(b.tokens)[rest]) and not np.any(np.asarray(b.row_mask)[rest])


def with_needed_fields(est, r: Rollouts) -> Rollouts:
  """`r` with the optional fields `est` always reads. A batch without one is refused by name
  first (remax: `greedy_outcome`, "set rollout.greedy_baseline=True"); the stand-in filled
  then is R_out of each group's first valid row (the episode runner's own greedy rollout is
  tested in test_rollout_episodes)."""
  import pytest  # pylint: disable=import-outside-toplevel
  if "greedy_outcome" in est.needs and r.greedy_outcome is None:
    with pytest.raises(ValueError, match="greedy_baseline"):
      est(r)
    group, valid = np.asarray(r.group_id), np.asarray(r.row_valid)
    outcome = np.asarray(r.outcome)
    first = {}
    for b in np.flatnonzero(valid):
      first.setdefault(int(group[b]), float(outcome[b]))
    filled = np.array([first.get(int(g), 0.0) for g in group], np.float32)
    r = r.replace(greedy_outcome=jnp.asarray(filled))
  return r
