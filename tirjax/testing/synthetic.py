"""Random rollout batches: PORTool rollout trees and independent rollouts (spec §4.1).

For tests, kernel benchmarks and credit-assignment studies. Generation is numpy-vectorised
over queries (one loop over depths), so paper-scale batches take milliseconds; `validate`
runs on every batch returned.

    rng = np.random.default_rng(0)
    r = tree_rollouts(rng, [8] * 256)                      # n = 8, f = 2, T_max = 6
    r = independent_rollouts(rng, [16] * 256, max_depth=10)
    r = tree_rollouts(rng, rng.integers(1, 9, 32), num_rows=256, max_steps=8)  # ragged, padded

Two stages, so tests can feed their own tree shapes: `tree_paths` / `independent_paths` draw
the shape (which rows pass through which nodes, who finished), `to_rollouts` draws the rest
(outcomes, format rewards, calls, tokens) per node and pads to a fixed shape.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence, Union

import numpy as np

from tirjax.rollouts import Rollouts, from_numpy, state_ids


class Paths(NamedTuple):
  """The shape of a batch: each row's path of node ids from its query's root."""

  group_id: np.ndarray  # [R] int, query of each row
  node_id: np.ndarray  # [R, D] int, node of step t (-1 past the row's end); rows sharing a
  #                      prefix share its ids; ids are 0..N-1 across the batch
  num_steps: np.ndarray  # [R] int
  finished: np.ndarray  # [R] bool, the row answered (else it was cut at T_max: R_out = -1)


def _check_sizes(group_sizes) -> np.ndarray:
  sizes = np.asarray(group_sizes, dtype=np.int64).reshape(-1)
  if sizes.size == 0 or np.any(sizes < 1):
    raise ValueError(f"group_sizes: need at least one group, each of size >= 1, got {sizes}")
  return sizes


def _check_prob(name: str, p: float) -> None:
  if not 0.0 <= p <= 1.0:
    raise ValueError(f"{name}: must lie in [0, 1], got {p}")


def _compact(group_id, node_id, num_steps, finished) -> Paths:
  used = node_id >= 0
  ids = np.full(node_id.shape, -1, np.int64)
  ids[used] = np.unique(node_id[used], return_inverse=True)[1]
  return Paths(group_id.astype(np.int64), ids, num_steps.astype(np.int64), finished)


def tree_paths(rng: np.random.Generator, group_sizes: Sequence[int], *, branching: int = 2,
               max_depth: int = 6, finish_prob: float = 0.3) -> Paths:
  """Rollout trees by PORTool's Algorithm 1, one per query, with n = group_sizes[q] rows.

  n first steps are drawn independently. At each later depth every active (unfinished) node
  proposes `branching` (f) candidates and exactly n − n_c of all candidates (n_c = finished
  rows) are kept, uniformly at random without replacement; nodes left without a kept child
  are dropped. Each new step answers (finishes its row) with probability `finish_prob`; rows
  still active after `max_depth` steps are unfinished.
  """
  n = _check_sizes(group_sizes)
  _check_prob("finish_prob", finish_prob)
  if branching < 1 or max_depth < 1:
    raise ValueError(f"branching, max_depth: must be >= 1, got {branching}, {max_depth}")
  Q, W, f = n.size, int(n.max()), branching
  # Each query holds W row slots; an active slot is an active node (their number stays n − n_c).
  exists = np.arange(W)[None, :] < n[:, None]
  paths = np.full((Q, W, max_depth), -1, np.int64)
  paths[:, :, 0] = np.where(exists, np.arange(Q * W).reshape(Q, W), -1)
  next_id = Q * W
  steps = exists.astype(np.int64)
  done = exists & (rng.random((Q, W)) < finish_prob)
  for d in range(1, max_depth):
    active = exists & ~done
    if not active.any():
      break
    # Candidate c of a query belongs to slot c // f; the a_q smallest random keys are kept.
    keys = np.where(np.repeat(active, f, axis=1), rng.random((Q, W * f)), 2.0)
    order = np.argsort(keys, axis=1)
    rank = np.clip(np.cumsum(active, axis=1) - 1, 0, None)
    chosen = np.take_along_axis(order, rank, axis=1)  # the kept candidate each active slot takes
    grown = np.take_along_axis(paths, (chosen // f)[:, :, None], axis=1)
    grown[:, :, d] = next_id + np.arange(Q)[:, None] * (W * f) + chosen
    next_id += Q * W * f
    paths = np.where(active[:, :, None], grown, paths)
    steps = np.where(active, d + 1, steps)
    done |= active & (rng.random((Q, W)) < finish_prob)
  group_id = np.broadcast_to(np.arange(Q)[:, None], (Q, W))[exists]
  return _compact(group_id, paths[exists], steps[exists], done[exists])


def independent_paths(rng: np.random.Generator, group_sizes: Sequence[int], *,
                      max_depth: int = 10, finish_prob: float = 0.3) -> Paths:
  """Independent rollouts: every step is its own node (the root is the only fork).

  Each step answers with probability `finish_prob`; rows without an answer after
  `max_depth` steps are unfinished.
  """
  n = _check_sizes(group_sizes)
  _check_prob("finish_prob", finish_prob)
  if max_depth < 1:
    raise ValueError(f"max_depth: must be >= 1, got {max_depth}")
  R = int(n.sum())
  answers = rng.random((R, max_depth)) < finish_prob
  finished = answers.any(axis=1)
  num_steps = np.where(finished, np.argmax(answers, axis=1) + 1, max_depth)
  valid = np.arange(max_depth)[None, :] < num_steps[:, None]
  node_id = np.where(valid, np.arange(R * max_depth).reshape(R, max_depth), -1)
  return _compact(np.repeat(np.arange(n.size), n), node_id, num_steps, finished)


def to_rollouts(
    rng: np.random.Generator,
    paths: Paths,
    *,
    outcome_probs: Optional[Sequence[float]] = None,
    format_reward: Union[str, float] = "uniform",
    num_rows: Optional[int] = None,
    max_steps: Optional[int] = None,
    max_calls: int = 1,
    max_gt_calls: int = 1,
    prompt_tokens: int = 2,
    step_tokens: int = 2,
    response_tokens: int = 1,
    vocab_size: int = 1000,
    num_observations: int = 2,
    right_prob: Optional[float] = None,
) -> Rollouts:
  """Draws everything but the tree shape, per node (shared steps share it), and pads.

  Args:
    rng: numpy generator.
    paths: the tree shape (`tree_paths`, `independent_paths`, or hand-made).
    outcome_probs: probabilities of R_out = (+1, 0, −1) for an answered row; None draws them
      per query from a flat Dirichlet, so groups range from all-correct to all-wrong.
      Unfinished rows get −1.
    format_reward: R_fm per step: "uniform" in [−0.25, 0.25], "levels" (0.25 · (2k/5 − 1),
      k ~ U{0..5}, the five-check reward of spec §4.1, with ties), or one constant.
    num_rows, max_steps: padded B and T (default: just fit). K = `max_calls`,
      C = `max_gt_calls`: each step has U{0..K} calls, each query U{0..C} ground-truth calls,
      and half of the valid pairs a similarity in (0, 1].
    prompt_tokens, step_tokens, response_tokens: token layout; each row is its prompt, then
      per step its generated tokens and its tool-response tokens, so L = P + T · (S + Rs).
    vocab_size: token ids lie in [1, vocab_size).
    num_observations: each node's tool calls and responses are one of this many (drawn per
      node), so that different nodes often leave the same history: `state_id` (GiGPO's anchor
      states) groups steps across branches.
    right_prob: the chance that a node's step is right (`turn_label` +1, else -1), drawn per
      node; None draws it per query uniformly from [0, 1], so groups range from all right to
      all wrong. Drawn from a stream of its own (`rng.spawn`): `rng` and every other field
      are what they were before the labels existed.

  Returns:
    A validated `Rollouts` (with `ref_logprobs`, `greedy_outcome` (drawn per query like an
    answered row's outcome), `state_id` and `turn_label`; `calls` and FTRL fields are
    None).
  """
  R, D = paths.node_id.shape
  B = R if num_rows is None else num_rows
  T = D if max_steps is None else max_steps
  if B < R or T < int(paths.num_steps.max(initial=0)):
    raise ValueError(f"num_rows={B}, max_steps={T}: too small for {R} rows of up to "
                     f"{int(paths.num_steps.max(initial=0))} steps")
  K, C, S = max_calls, max_gt_calls, step_tokens + response_tokens
  if right_prob is not None:
    _check_prob("right_prob", right_prob)
  if min(K, C, prompt_tokens, step_tokens) < 1 or response_tokens < 0 or vocab_size < 2:
    raise ValueError("max_calls, max_gt_calls, prompt_tokens, step_tokens: must be >= 1; "
                     "response_tokens >= 0; vocab_size >= 2")
  Q = int(paths.group_id.max(initial=-1)) + 1
  N = int(paths.node_id.max(initial=0)) + 1  # per-node tables (at least one row, for padding)
  node_fm = _node_format_reward(rng, format_reward, N)

  row_valid = np.arange(B) < R
  group_id = np.zeros(B, np.int32)
  group_id[:R] = paths.group_id
  node_id = np.full((B, T), -1, np.int32)
  node_id[:R, :min(D, T)] = paths.node_id[:, :T]
  num_steps = np.zeros(B, np.int32)
  num_steps[:R] = paths.num_steps
  answered = np.zeros(B, bool)
  answered[:R] = paths.finished
  sv = node_id >= 0
  nid = np.maximum(node_id, 0)

  probs = (rng.dirichlet(np.ones(3), Q) if outcome_probs is None
           else np.broadcast_to(_check_outcome_probs(outcome_probs), (Q, 3)))
  cum = np.cumsum(probs, axis=1)[group_id]
  drawn = np.array([1.0, 0.0, -1.0])[np.minimum((rng.random(B)[:, None] > cum).sum(1), 2)]
  outcome = np.where(answered, drawn, -1.0) * row_valid

  node_calls = np.arange(K)[None, :] < rng.integers(0, K + 1, N)[:, None]
  node_sim = np.where(rng.random((N, K, C)) < 0.5, 0.0, 1.0 - rng.random((N, K, C)))
  group_gt = np.arange(C)[None, :] < rng.integers(0, C + 1, max(Q, 1))[:, None]
  call_valid = node_calls[nid] & sv[:, :, None]
  gt_valid = group_gt[group_id] & row_valid[:, None]
  call_sim = node_sim[nid] * call_valid[..., None] * gt_valid[:, None, None, :]

  L = prompt_tokens + T * S
  pos = np.arange(L)[None, :]
  step = (pos - prompt_tokens) // S
  offset = (pos - prompt_tokens) % S
  real = (pos < prompt_tokens + num_steps[:, None] * S) & row_valid[:, None]
  generated = real & (pos >= prompt_tokens) & (offset < step_tokens)
  step_node = np.take_along_axis(nid, np.clip(step, 0, T - 1).repeat(B, 0), axis=1)
  node_logp = -rng.exponential(1.0, (N, step_tokens))
  tokens = np.where(pos < prompt_tokens, group_id[:, None] * 31 + pos,
                    step_node * S + offset + 7)
  tokens = np.where(real, 1 + tokens % (vocab_size - 1), 0)
  old_logprobs = np.where(generated, node_logp[step_node, np.minimum(offset, step_tokens - 1)],
                          0.0)
  ref_logprobs = np.where(generated, old_logprobs + 0.1 * rng.standard_normal((B, L)), 0.0)

  # Drawn last, so that every field above is what it was before these two existed.
  greedy = np.array([1.0, 0.0, -1.0])[np.minimum(
      (rng.random(max(Q, 1))[:, None] > np.cumsum(probs, axis=1)).sum(1), 2)]
  node_obs = rng.integers(0, num_observations, N)  # what each step's calls and responses were
  label_rng = rng.spawn(1)[0]  # leaves `rng`'s own draws as they were
  p_right = (label_rng.random(max(Q, 1)) if right_prob is None
             else np.full(max(Q, 1), right_prob))
  node_group = np.zeros(N, np.int64)
  node_group[nid[sv]] = np.broadcast_to(group_id[:, None], sv.shape)[sv]
  node_right = label_rng.random(N) < p_right[node_group]
  return from_numpy(dict(
      group_id=group_id, row_valid=row_valid, outcome=outcome, num_steps=num_steps,
      answered=answered, step_valid=sv, node_id=node_id,
      format_reward=np.where(sv, node_fm[nid], 0.0), call_valid=call_valid, call_sim=call_sim,
      gt_valid=gt_valid, answer_score=outcome == 1.0, tokens=tokens, token_valid=real,
      loss_mask=generated, token_step=np.where(generated, step, -1), old_logprobs=old_logprobs,
      policy_version=np.zeros(B), ref_logprobs=ref_logprobs,
      greedy_outcome=np.where(row_valid, greedy[group_id], 0.0),
      state_id=state_ids(group_id, node_obs[nid], sv),
      turn_label=np.where(sv, np.where(node_right[nid], 1, -1), 0)))


def _node_format_reward(rng, mode, num_nodes: int) -> np.ndarray:
  if mode == "uniform":
    return rng.uniform(-0.25, 0.25, num_nodes)
  if mode == "levels":
    return 0.25 * (2.0 * rng.integers(0, 6, num_nodes) / 5.0 - 1.0)
  if isinstance(mode, (int, float)) and not isinstance(mode, bool) and abs(mode) <= 0.25:
    return np.full(num_nodes, float(mode))
  raise ValueError(f"format_reward: must be 'uniform', 'levels' or a number in "
                   f"[-0.25, 0.25], got {mode!r}")


def _check_outcome_probs(p) -> np.ndarray:
  p = np.asarray(p, np.float64)
  if p.shape != (3,) or np.any(p < 0) or not np.isclose(p.sum(), 1.0):
    raise ValueError(f"outcome_probs: must be 3 probabilities of (+1, 0, -1) summing to 1, "
                     f"got {p.tolist()}")
  return p


def tree_rollouts(rng: np.random.Generator, group_sizes: Sequence[int], *, branching: int = 2,
                  max_depth: int = 6, finish_prob: float = 0.3, **kwargs) -> Rollouts:
  """Algorithm-1 rollout trees (`tree_paths`) made into a batch (`to_rollouts` kwargs)."""
  paths = tree_paths(rng, group_sizes, branching=branching, max_depth=max_depth,
                     finish_prob=finish_prob)
  return to_rollouts(rng, paths, **kwargs)


def independent_rollouts(rng: np.random.Generator, group_sizes: Sequence[int], *,
                         max_depth: int = 10, finish_prob: float = 0.3, **kwargs) -> Rollouts:
  """Independent rollouts (`independent_paths`) made into a batch (`to_rollouts` kwargs)."""
  paths = independent_paths(rng, group_sizes, max_depth=max_depth, finish_prob=finish_prob)
  return to_rollouts(rng, paths, **kwargs)
