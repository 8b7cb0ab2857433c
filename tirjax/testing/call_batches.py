"""Random ragged `Rollouts` with tool calls for property tests, padded to fixed shapes.

`random_batch(rng, shape)` draws groups of varying size (padding rows interleaved), rows with
varying numbers of steps, calls in random slots, ground-truth sets in random slots, and a
`call_sim` that is continuous (a unique optimal matching almost surely, so that kernels and
references agree on which calls are matched) or drawn from a few levels (ties).
"""

from __future__ import annotations

import numpy as np

from tirjax.rollouts import Rollouts, from_numpy
from tirjax.testing.padding import move_rows, widen
from tirjax.testing.synthetic_calls import FORMAT_LEVELS

# (B, T, K, C): m = T*K predicted slots above, equal to and below n = C ground-truth slots.
SHAPES = {"wide": (12, 4, 3, 4), "tall": (9, 2, 2, 6), "square": (8, 3, 2, 6)}


def random_batch(rng: np.random.Generator, shape=SHAPES["wide"], *, ties: bool = False,
                 p_sim: float = 0.6, p_answer: float = 0.7, p_call: float = 0.6,
                 max_groups: int = 4) -> Rollouts:
  B, T, K, C = shape
  used = int(rng.integers(1, B + 1))
  num_groups = int(rng.integers(1, min(max_groups, used) + 1))
  rows = rng.permutation(B)[:used]  # valid rows sit at random positions
  group_id = rng.integers(0, B, size=B).astype(np.int32)  # padding rows: any in-range id
  labels = rng.integers(0, num_groups, size=used)
  gids = rng.permutation(B)[:num_groups]
  group_id[rows] = gids[labels]
  row_valid = np.zeros(B, bool)
  row_valid[rows] = True

  gt_of_group = rng.random((num_groups, C)) < rng.random((num_groups, 1))
  gt_valid = np.zeros((B, C), bool)
  gt_valid[rows] = gt_of_group[labels]
  num_steps = np.where(row_valid, rng.integers(0, T + 1, size=B), 0).astype(np.int32)
  num_steps[rows] = np.maximum(num_steps[rows], rng.random(used) < 0.9)  # few empty rows
  step_valid = np.arange(T)[None, :] < num_steps[:, None]
  call_valid = step_valid[:, :, None] & (rng.random((B, T, K)) < p_call)
  pair = call_valid[..., None] & gt_valid[:, None, None, :]
  if ties:
    values = rng.integers(1, 5, size=(B, T, K, C)) / 4.0
  else:
    values = rng.uniform(0.05, 1.0, size=(B, T, K, C))
  call_sim = np.where(pair & (rng.random((B, T, K, C)) < p_sim), values, 0.0).astype(np.float32)

  answered = row_valid & (num_steps > 0) & (rng.random(B) < p_answer)
  outcome = np.where(answered, rng.choice([-1.0, 0.0, 1.0], size=B, p=[0.4, 0.1, 0.5]), -1.0)
  answer_score = np.where(answered, np.where(outcome == 1, 1.0, rng.random(B) * 0.5), 0.0)
  format_reward = np.where(step_valid, rng.choice(FORMAT_LEVELS, size=(B, T),
                                                  p=[.05, .05, .1, .1, .1, .6]), 0.0)
  call_solves = call_valid & (rng.random((B, T, K)) < 0.3)
  num_expected = np.where(row_valid, rng.integers(0, 4, size=B), 0).astype(np.int32)
  num_expected[rows] = rng.integers(0, 4, size=num_groups)[labels]
  return _assemble(group_id, row_valid, outcome, num_steps, answered, step_valid,
                   format_reward, call_valid, call_sim, gt_valid, answer_score, call_solves,
                   num_expected)


def _assemble(group_id, row_valid, outcome, num_steps, answered, step_valid, format_reward,
              call_valid, call_sim, gt_valid, answer_score, call_solves, num_expected):
  """Adds tokens (one generated and one tool-response token per step) and validates."""
  B, T = step_valid.shape
  L = 1 + 2 * T
  pos = np.arange(L)[None, :]
  length = np.where(row_valid, 1 + 2 * num_steps, 0)
  token_valid = pos < length[:, None]
  gen = (pos % 2 == 1) & token_valid
  token_step = np.where(gen, (pos - 1) // 2, -1).astype(np.int32)
  node_id = np.where(step_valid, np.arange(B)[:, None] * T + np.arange(T)[None, :], -1)
  return from_numpy(dict(
      group_id=group_id, row_valid=row_valid, outcome=outcome, num_steps=num_steps,
      answered=answered, step_valid=step_valid, node_id=node_id, format_reward=format_reward,
      call_valid=call_valid, call_sim=call_sim, gt_valid=gt_valid, answer_score=answer_score,
      tokens=np.where(token_valid, 7, 0), token_valid=token_valid, loss_mask=gen,
      token_step=token_step, old_logprobs=np.zeros((B, L)), policy_version=np.zeros(B),
      call_solves=call_solves, num_expected=num_expected))


def from_rows(rows, num_gt: int, shape=None) -> Rollouts:
  """A batch from hand-written rows, for worked examples.

  Each row is a dict: `group` (int), `steps` (a list of steps, each a list of calls, each a
  dict {ground-truth index: similarity}), and optionally `answered`, `answer_score`,
  `outcome`, `format` (one R_fm per step), `solves` (per step, per call), `num_expected`.
  Every row of a group gets the ground-truth slots 0..num_gt-1.
  """
  need = (len(rows), max([len(r["steps"]) for r in rows] + [1]),
          max([len(s) for r in rows for s in r["steps"]] + [1]), max(num_gt, 1))
  B, T, K, C = shape or need
  a = dict(group_id=np.zeros(B, np.int32), row_valid=np.zeros(B, bool),
           outcome=np.zeros(B), num_steps=np.zeros(B, np.int32), answered=np.zeros(B, bool),
           format_reward=np.zeros((B, T)), call_valid=np.zeros((B, T, K), bool),
           call_sim=np.zeros((B, T, K, C)), gt_valid=np.zeros((B, C), bool),
           answer_score=np.zeros(B), call_solves=np.zeros((B, T, K), bool),
           num_expected=np.zeros(B, np.int32))
  for b, row in enumerate(rows):
    a["group_id"][b] = row["group"]
    a["row_valid"][b] = True
    a["num_steps"][b] = len(row["steps"])
    a["answered"][b] = row.get("answered", False)
    a["answer_score"][b] = row.get("answer_score", 0.0)
    a["outcome"][b] = row.get("outcome", -1.0)
    a["num_expected"][b] = row.get("num_expected", 0)
    a["gt_valid"][b, :num_gt] = True
    for t, calls in enumerate(row["steps"]):
      a["format_reward"][b, t] = row.get("format", [0.25] * T)[t]
      for k, sims in enumerate(calls):
        a["call_valid"][b, t, k] = True
        a["call_solves"][b, t, k] = row.get("solves", [[False] * K] * T)[t][k]
        for c, s in sims.items():
          a["call_sim"][b, t, k, c] = s
  step_valid = np.arange(T)[None, :] < a["num_steps"][:, None]
  return _assemble(a["group_id"], a["row_valid"], a["outcome"], a["num_steps"], a["answered"],
                   step_valid, a["format_reward"], a["call_valid"], a["call_sim"], a["gt_valid"],
                   a["answer_score"], a["call_solves"], a["num_expected"])


def repad(r: Rollouts, shape, positions) -> Rollouts:
  """The same rows in a larger padded shape: row b moves to positions[b]; extra slots pad."""
  B2, T2, K2, C2 = shape
  a = widen(move_rows(r, positions, B2), T=T2, K=K2, C=C2)
  return _assemble(a["group_id"], a["row_valid"], a["outcome"], a["num_steps"], a["answered"],
                   a["step_valid"], a["format_reward"], a["call_valid"], a["call_sim"],
                   a["gt_valid"], a["answer_score"], a["call_solves"], a["num_expected"])
