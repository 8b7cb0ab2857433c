"""Random `Rollouts` with encoded tool calls, at paper scale, for matching estimators.

`random_call_rollouts(seed)` builds in numpy (vectorised, no loop over rows or calls) a batch
shaped like HiDiffTIR's training (256 queries × 16 rows, 10 turns, up to 4 calls a turn, 8
ground-truth calls): each query draws ground-truth calls (tool name, parameter names and
values); each predicted call copies one of them, perturbed (a wrong value, a missing or an
extra parameter) or not, or is an unrelated call. Filtered rows are padding, so groups are
ragged. `call_sim` is computed from the encodings on device (`similarity.call_similarity`);
`call_solves` marks, per row, the first exact copy of each ground-truth call (its output
would verify that call's expected answer), and `num_expected` is the number of
ground-truth calls. `greedy_outcome` is one greedy rollout's R_out per query (ReMax),
`state_id` the anchor states of GiGPO (steps with equal calls so far share one) and
`turn_label` each step's ground-truth label (the oracle's): right when all its calls are exact
copies of ground-truth calls, or, for the answering step, when R_out is +1.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from tirjax.matching.similarity import call_similarity
from tirjax.rollouts import Rollouts, call_encoding, from_numpy, state_ids

FORMAT_LEVELS = 0.25 * (2 * np.arange(6) / 5 - 1)  # R_fm for 0..5 passed checks


def random_call_rollouts(seed: int = 0, *, num_queries: int = 256, group_size: int = 16,
                         max_steps: int = 10, max_calls: int = 4, max_gt_calls: int = 8,
                         max_params: int = 4, num_tools: int = 12, num_keys: int = 16,
                         num_values: int = 4, p_copy: float = 0.6, p_filtered: float = 0.1,
                         tokens_per_step: int = 4, check: bool = True) -> Rollouts:
  """A random batch of B = num_queries · group_size rows (see the module docstring).

  Args:
    seed: numpy random seed.
    p_copy: chance that a predicted call copies (then perhaps perturbs) a ground-truth call.
    p_filtered: chance that a row is padding (a filtered-out rollout).
    check: run `rollouts.validate` on the result (host-side, a few tenths of a second).
  """
  if num_values < 2 or num_keys < max_params:
    raise ValueError(f"num_values must be >= 2 and num_keys >= max_params, got "
                     f"num_values={num_values}, num_keys={num_keys}, max_params={max_params}")
  rng = np.random.default_rng(seed)
  Q, G, T, K, C, P = num_queries, group_size, max_steps, max_calls, max_gt_calls, max_params
  B = Q * G
  query = np.repeat(np.arange(Q), G)

  # Ground truth per query: C slots, the first n_gt valid; distinct parameter names per call.
  n_gt = rng.integers(0, C + 1, size=Q)
  n_gt = np.where(rng.random(Q) < 0.95, np.maximum(n_gt, 1), 0)
  q_gt_valid = np.arange(C)[None, :] < n_gt[:, None]
  q_name = np.where(q_gt_valid, rng.integers(0, num_tools, size=(Q, C)), -1)
  n_keys = np.where(q_gt_valid, rng.integers(0, P + 1, size=(Q, C)), 0)
  q_keys = _distinct_keys(rng, (Q, C), P, num_keys, n_keys)
  q_values = np.where(q_keys >= 0, rng.integers(0, num_values, size=(Q, C, P)), -1)

  row_valid = rng.random(B) >= p_filtered
  num_steps = np.where(row_valid, rng.integers(1, T + 1, size=B), 0)
  step_valid = np.arange(T)[None, :] < num_steps[:, None]
  answered = row_valid & (rng.random(B) < 0.8)
  last = np.arange(T)[None, :] == (num_steps[:, None] - 1)
  n_calls = rng.integers(0, K + 1, size=(B, T))
  n_calls = np.where(last & answered[:, None], rng.integers(0, 2, size=(B, T)), n_calls)
  call_valid = step_valid[:, :, None] & (np.arange(K)[None, None, :] < n_calls[:, :, None])

  # Predicted calls: a copy of a ground-truth call of the row's query, or an unrelated call.
  src = rng.integers(0, np.maximum(n_gt[query], 1)[:, None, None], size=(B, T, K))
  copy = call_valid & (rng.random((B, T, K)) < p_copy) & (n_gt[query] > 0)[:, None, None]
  qi = query[:, None, None]
  name = np.where(copy, q_name[qi, src], rng.integers(0, num_tools, size=(B, T, K)))
  keys = np.where(copy[..., None], q_keys[qi, src],
                  _distinct_keys(rng, (B, T, K), P, num_keys, rng.integers(0, P + 1,
                                                                           size=(B, T, K))))
  values = np.where(copy[..., None], q_values[qi, src],
                    np.where(keys >= 0, rng.integers(0, num_values, size=(B, T, K, P)), -1))
  values, keys = _perturb(rng, values, keys, copy & (rng.random((B, T, K)) < 0.5), num_keys,
                          num_values)
  exact = copy & np.all((keys == q_keys[qi, src]) & (values == q_values[qi, src]), axis=-1)
  name, keys, values = (np.where(call_valid, name, -1),
                        np.where(call_valid[..., None], keys, -1),
                        np.where(call_valid[..., None], values, -1))

  gt_valid = q_gt_valid[query] & row_valid[:, None]
  a = {"calls.pred_name": name, "calls.pred_keys": keys, "calls.pred_values": values,
       "calls.gt_name": np.where(gt_valid, q_name[query], -1),
       "calls.gt_keys": np.where(gt_valid[..., None], q_keys[query], -1),
       "calls.gt_values": np.where(gt_valid[..., None], q_values[query], -1)}
  call_sim = call_similarity(call_encoding(a), jnp.asarray(call_valid), jnp.asarray(gt_valid))

  outcome = np.where(answered, rng.choice([-1.0, 0.0, 1.0], size=B, p=[0.45, 0.05, 0.5]), -1.0)
  outcome = np.where(row_valid, outcome, 0.0)
  a.update(
      group_id=query, row_valid=row_valid, outcome=outcome, num_steps=num_steps,
      answered=answered, step_valid=step_valid,
      node_id=np.where(step_valid, np.arange(B * T).reshape(B, T), -1),
      format_reward=np.where(step_valid, rng.choice(
          FORMAT_LEVELS, size=(B, T), p=[.02, .03, .05, .05, .1, .75]), 0.0),
      call_valid=call_valid, call_sim=call_sim, gt_valid=gt_valid, answer_score=outcome == 1,
      **_tokens(rng, row_valid, num_steps, T, tokens_per_step),
      call_solves=_first_exact(exact & call_valid, src),
      num_expected=np.where(row_valid, n_gt[query], 0))
  # Drawn last, so that every field above is what it was before these two existed.
  greedy = np.where(rng.random(Q) < 0.8, rng.choice([-1.0, 0.0, 1.0], size=Q,
                                                    p=[0.45, 0.05, 0.5]), -1.0)
  a["greedy_outcome"] = np.where(row_valid, greedy[query], 0.0)
  # A step's calls decide its tool responses: equal call slots, the same step for GiGPO.
  step_calls = np.concatenate([name[..., None], keys, values], axis=-1).reshape(B * T, -1)
  step_key = np.unique(step_calls, axis=0, return_inverse=True)[1].reshape(B, T)
  a["state_id"] = state_ids(query, step_key, step_valid)
  # Ground-truth turn labels (the oracle's), from the fields above (no draw): a step with calls
  # is right when each is an exact copy of a ground-truth call, the answering step when R_out
  # is +1; any other step (no call, a perturbed or unrelated call, a wrong answer) is wrong.
  answer_step = last & answered[:, None]
  right = np.where(answer_step, (outcome == 1.0)[:, None],
                   (n_calls > 0) & np.all(exact | ~call_valid, axis=-1))
  a["turn_label"] = np.where(step_valid, np.where(right, 1, -1), 0)
  return from_numpy(a, check=check)


def _distinct_keys(rng, shape, P, num_keys, count):
  """[*shape, P] distinct key ids in the first `count` slots, -1 after (random subsets)."""
  order = np.argsort(rng.random(shape + (num_keys,)), axis=-1)[..., :P]
  return np.where(np.arange(P) < np.asarray(count)[..., None], order, -1)


def _perturb(rng, values, keys, which, num_keys, num_values):
  """On `which` calls: change one value, drop one parameter, or add an unknown one."""
  P = keys.shape[-1]
  kind = rng.integers(0, 3, size=which.shape)
  slot = rng.integers(0, P, size=which.shape)[..., None] == np.arange(P)
  has = keys >= 0
  change = (which & (kind == 0))[..., None] & slot & has
  values = np.where(change, (values + rng.integers(1, num_values, size=values.shape))
                    % num_values, values)
  drop = (which & (kind == 1))[..., None] & slot & has
  keys, values = np.where(drop, -1, keys), np.where(drop, -1, values)
  # An extra parameter, named outside the ground truth's key ids (num_keys + slot).
  add = (which & (kind == 2))[..., None] & slot & ~has
  keys = np.where(add, num_keys + np.arange(P), keys)
  values = np.where(add, 0, values)
  return values, keys


def _first_exact(exact, src):
  """Per row, the first exact copy (turn, then slot order) of each ground-truth call."""
  B, T, K = exact.shape
  flat = np.where(exact, src, -1).reshape(B, T * K)
  earlier = (flat[:, :, None] == flat[:, None, :]) & np.tril(np.ones((T * K, T * K), bool), -1)
  first = (flat >= 0) & ~np.any(earlier, axis=2)
  return first.reshape(B, T, K)


def _tokens(rng, row_valid, num_steps, T, per_step):
  """Token fields: 2 prompt tokens, then per step `per_step` generated and 2 response tokens."""
  B = row_valid.shape[0]
  span = per_step + 2
  L = 2 + T * span
  pos = np.arange(L)[None, :]
  length = np.where(row_valid, 2 + num_steps * span, 0)
  token_valid = pos < length[:, None]
  offset = pos - 2
  generated = token_valid & (offset >= 0) & (offset % span < per_step)
  token_step = np.where(generated, offset // span, -1)
  tokens = np.where(token_valid, rng.integers(3, 1000, size=(B, L)), 0)
  return dict(tokens=tokens, token_valid=token_valid, loss_mask=generated,
              token_step=token_step,
              old_logprobs=np.where(generated, -rng.random((B, L)), 0.0),
              policy_version=np.zeros(B))