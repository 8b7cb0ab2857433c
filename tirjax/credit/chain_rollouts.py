"""Rollouts of a policy on the chain task: PORTool's Algorithm 1 trees, or independent rows.

One "token" per step: the action id, with `old_logprobs` = log π(a | s) of the behaviour
policy and `token_step` = t. Rows that share a prefix share its node ids. Every step is a
tool call except the answer (the terminal tool, so not in `call_valid`); the query's
ground-truth calls are the chain tools 1..D, so matching-based estimators see the necessary
steps (`call_sim` = 1 for a call of a chain tool, the similarity of two calls of one tool
without parameters), and FTRL's `call_solves` marks the calls that advanced the chain.
A step's tool response follows from its call, so GiGPO's anchor state (`state_id`) is the
row's actions so far; ReMax's `greedy_outcome` is the outcome of the behaviour policy's
greedy episode (the task is deterministic, so it is exact). The oracle's `turn_label` is +1 on
the optimal policy's action (the next chain tool, or the answer once the chain is done) and −1
on any other (a detour, a fatal call, an early answer). `sum_pi_squared` is Σ_a π(a | s)² of
the behaviour policy at each step's state, exact from the policy table (the optimal token
baselines' energy, `energy="sum_pi_squared"`). IGPO's `answer_logprob` (the probability of the
gold answer if the agent answered before the step) is the task's own: the answer is right at
progress D and never before, so P = 1 once the chain is done and `ANSWER_FLOOR` before (a
floor, so that its log is finite): the information gain is 1 − floor on the step that
completes the chain and 0 on every other (the tabular policy has no belief to probe).

Sampling is numpy-vectorised over queries (one loop over depths) from the policy table.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import numpy as np

from tirjax import option_checks
from tirjax.credit import evaluate
from tirjax.credit.task import ANSWER, ChainTask, state_index, transition
from tirjax.rollouts import CallEncoding, Rollouts, state_ids, validate

KINDS = ("tree", "independent")
ANSWER_FLOOR = 1e-3  # IGPO's P(gold answer) before the chain is done (module docstring)


@dataclasses.dataclass(frozen=True)
class ChainRolloutOptions:
  """Attributes:
    kind: "tree" (PORTool's Algorithm 1) or "independent" (n rows per query).
    group_size: n, rows per query.
    branching: f, candidates each active node proposes per depth (trees only).
    num_queries: queries (groups) per batch; B = num_queries · group_size.
  """

  kind: str = "tree"
  group_size: int = 8
  branching: int = 2
  num_queries: int = 16

  def __post_init__(self):
    option_checks.one_of("kind", self.kind, KINDS)
    for name in ("group_size", "branching", "num_queries"):
      option_checks.at_least(name, getattr(self, name), 1)


class Episodes(NamedTuple):
  """The sampled trees before padding: rows of node paths and per-node step tables."""

  group_id: np.ndarray  # [R] query of each row
  node_id: np.ndarray  # [R, T] node of step t (-1 past the row's end), ids 0..N-1
  num_steps: np.ndarray  # [R]
  answered: np.ndarray  # [R] bool
  outcome: np.ndarray  # [R] R_out
  action: np.ndarray  # [N] per node
  state: np.ndarray  # [N] policy state the action was sampled in
  logprob: np.ndarray  # [N] log π(action | state) of the behaviour policy
  format_reward: np.ndarray  # [N]
  solves: np.ndarray  # [N] bool, the step advanced the chain
  right: np.ndarray  # [N] bool, the optimal action (advance, or the answer at progress D)
  informed: np.ndarray  # [N] bool, the chain was done before the step (IGPO's probe)
  num_samples: int  # sampled steps, dropped candidates included
  greedy_outcome: float = -1.0  # R_out of the behaviour policy's greedy episode (ReMax)
  sum_pi_squared: np.ndarray | None = None  # [N] Σ_a π(a | state)² (the optimal token baselines)


class Batch(NamedTuple):
  rollouts: Rollouts
  states: jax.Array  # [B, L] int32 policy state of each token (0 where loss_mask is False)
  num_samples: int


def _sample(rng: np.random.Generator, probs: np.ndarray) -> np.ndarray:
  """One action per row of `probs` [..., A] by inverse CDF."""
  cum = np.cumsum(probs, axis=-1)
  u = rng.random(probs.shape[:-1])[..., None] * cum[..., -1:]
  return np.minimum(np.sum(u >= cum, axis=-1), probs.shape[-1] - 1)


def grow(rng: np.random.Generator, task: ChainTask, log_probs: np.ndarray,
         opts: ChainRolloutOptions) -> Episodes:
  """Samples `num_queries` rollout groups from the policy table `log_probs` [S, A].

  Algorithm 1 (spec §4.1): n first steps drawn independently; at each later depth every
  active node proposes f candidates and exactly n − n_c of all the query's candidates
  (n_c = finished rows) are kept, uniformly at random without replacement; nodes left
  without a kept child are dropped. Independent rollouts are the case f = 1: every active
  row keeps its one candidate.
  """
  Q, W, T, D = opts.num_queries, opts.group_size, task.max_steps, task.num_stages
  f = opts.branching if opts.kind == "tree" else 1
  log_probs = np.asarray(log_probs, np.float64)
  probs = np.exp(log_probs)
  capacity = Q * W * (1 + (T - 1) * f)
  table = {name: np.zeros(capacity, dtype) for name, dtype in [
      ("action", np.int64), ("state", np.int64), ("logprob", np.float64),
      ("format_reward", np.float64), ("solves", bool), ("right", bool),
      ("sum_pi_squared", np.float64), ("informed", bool)]}
  energy = np.sum(probs ** 2, axis=-1)  # [S] Σ_a π(a | s)²

  def record(ids, state, action, tr, keep, before):
    for name, value in [("action", action), ("state", state), ("informed", before >= D),
                        ("logprob", log_probs[state, action]),
                        ("sum_pi_squared", energy[state]),
                        ("format_reward", tr["format_reward"]), ("solves", tr["solves"]),
                        ("right", tr["solves"] | (tr["outcome"] == 1.0))]:
      table[name][ids[keep]] = value[keep]

  paths = np.full((Q, W, T), -1, np.int64)
  state = np.zeros((Q, W), np.int64)  # progress 0, step 0
  action = _sample(rng, probs[state])
  tr = transition(task, np.zeros((Q, W), np.int64), action)
  paths[:, :, 0] = np.arange(Q * W).reshape(Q, W)
  record(paths[:, :, 0], state, action, tr, np.ones((Q, W), bool), np.zeros((Q, W), np.int64))
  progress, done, answered, outcome = tr["progress"], tr["done"], tr["answered"], tr["outcome"]
  num_steps = np.ones((Q, W), np.int64)
  num_samples, next_id = Q * W, Q * W
  for d in range(1, T):
    active = ~done
    if not active.any():
      break
    state = state_index(task, progress, d)
    candidates = _sample(rng, np.repeat(probs[state], f, axis=1))  # [Q, W·f], slot c // f
    num_samples += f * int(active.sum())
    # The a_q smallest random keys among the active slots' candidates are kept, one per slot.
    keys = np.where(np.repeat(active, f, axis=1), rng.random((Q, W * f)), 2.0)
    rank = np.clip(np.cumsum(active, axis=1) - 1, 0, None)
    chosen = np.take_along_axis(np.argsort(keys, axis=1), rank, axis=1)
    parent = chosen // f
    new_state = np.take_along_axis(state, parent, axis=1)
    new_action = np.take_along_axis(candidates, chosen, axis=1)
    before = np.take_along_axis(progress, parent, axis=1)
    tr = transition(task, before, new_action)
    grown = np.take_along_axis(paths, parent[:, :, None], axis=1)
    grown[:, :, d] = next_id + np.arange(Q)[:, None] * (W * f) + chosen
    record(grown[:, :, d], new_state, new_action, tr, active, before)
    next_id += Q * W * f
    paths = np.where(active[:, :, None], grown, paths)
    progress = np.where(active, tr["progress"], progress)
    answered = np.where(active, tr["answered"], answered)
    outcome = np.where(active, tr["outcome"], outcome)
    num_steps = np.where(active, d + 1, num_steps)
    done = done | (active & tr["done"])
  outcome = np.where(done, outcome, -1.0)  # unanswered after T_max steps

  flat = paths.reshape(Q * W, T)
  used = flat >= 0
  node_id = np.full(flat.shape, -1, np.int64)
  uniq, node_id[used] = np.unique(flat[used], return_inverse=True)
  greedy = evaluate.policy_value(task, evaluate.greedy_probs(log_probs))["mean_outcome"]
  return Episodes(group_id=np.repeat(np.arange(Q), W), node_id=node_id,
                  num_steps=num_steps.reshape(-1), answered=answered.reshape(-1),
                  outcome=outcome.reshape(-1).astype(np.float64),
                  num_samples=num_samples, greedy_outcome=float(np.round(greedy)),
                  **{k: v[uniq] for k, v in table.items()})


def to_batch(task: ChainTask, ep: Episodes, policy_version: int = 0,
             check: bool = True) -> Batch:
  """Pads `Episodes` into a `Rollouts` batch (B = rows, T = L = T_max, K = 1, C = D).

  `check` runs `validate` on the batch (host-side; the contract every trainer batch meets).
  """
  B, T, D = ep.node_id.shape[0], task.max_steps, task.num_stages
  i32, f32 = np.int32, np.float32
  nid = np.maximum(ep.node_id, 0)
  sv = ep.node_id >= 0
  action = np.where(sv, ep.action[nid], 0).astype(i32)
  call = sv & (action != ANSWER)
  gt_name = np.broadcast_to(np.arange(1, D + 1, dtype=i32), (B, D))
  no_keys = np.full((B, T, 1, 1), -1, i32)
  calls = CallEncoding(pred_name=np.where(call, action, -1)[:, :, None], pred_keys=no_keys,
                       pred_values=no_keys, gt_name=gt_name,
                       gt_keys=np.full((B, D, 1), -1, i32), gt_values=np.full((B, D, 1), -1, i32))
  call_sim = call[:, :, None, None] & (action[:, :, None, None] == gt_name[:, None, None, :])
  r = Rollouts(
      group_id=ep.group_id.astype(i32), row_valid=np.ones(B, bool),
      outcome=ep.outcome.astype(f32), num_steps=ep.num_steps.astype(i32), answered=ep.answered,
      step_valid=sv, node_id=ep.node_id.astype(i32),
      format_reward=np.where(sv, ep.format_reward[nid], 0.0).astype(f32),
      call_valid=call[:, :, None], call_sim=call_sim.astype(f32), gt_valid=np.ones((B, D), bool),
      answer_score=(ep.outcome == 1.0).astype(f32), tokens=action, token_valid=sv, loss_mask=sv,
      token_step=np.where(sv, np.arange(T, dtype=i32), -1).astype(i32),
      old_logprobs=np.where(sv, ep.logprob[nid], 0.0).astype(f32),
      policy_version=np.full(B, policy_version, i32), calls=calls,
      call_solves=(call & ep.solves[nid])[:, :, None], num_expected=np.full(B, D, i32),
      greedy_outcome=np.full(B, ep.greedy_outcome, f32),
      state_id=state_ids(ep.group_id, action, sv),
      turn_label=np.where(sv, np.where(ep.right[nid], 1, -1), 0).astype(i32),
      answer_logprob=np.where(sv, np.where(ep.informed[nid], 0.0, np.log(ANSWER_FLOOR)),
                              0.0).astype(f32),
      sum_pi_squared=(None if ep.sum_pi_squared is None else
                      np.where(sv, np.minimum(ep.sum_pi_squared[nid], 1.0), 0.0).astype(f32)))
  # numpy → device without a dtype conversion (which would compile once per new shape).
  r = jax.device_put(jax.tree.map(np.ascontiguousarray, r))
  if check:
    validate(r)
  return Batch(r, jax.device_put(np.where(sv, ep.state[nid], 0).astype(i32)), ep.num_samples)


def sample_batch(rng: np.random.Generator, task: ChainTask, log_probs: np.ndarray,
                 opts: ChainRolloutOptions, policy_version: int = 0, check: bool = True) -> Batch:
  """`grow` then `to_batch`: one training batch from the policy table `log_probs` [S, A]."""
  return to_batch(task, grow(rng, task, log_probs, opts), policy_version, check)
