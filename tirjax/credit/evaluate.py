"""Exact evaluation of a policy on the chain task by forward dynamic programming.

The task is a small MDP over (progress, step), so the outcome distribution of a policy is
computed exactly instead of estimated from evaluation episodes: no evaluation noise, and the
"90 % of optimal" crossing is a property of the policy, not of an evaluation sample.
"""

from __future__ import annotations

import numpy as np

from tirjax.credit.task import ADVANCE, ANSWER_KIND, DETOUR, FATAL, ChainTask


def policy_value(task: ChainTask, probs: np.ndarray) -> dict[str, float]:
  """Outcome statistics of the stochastic policy `probs` [S, A] (rows sum to 1).

  Forward recursion over steps t with the mass m_t(k) of unfinished episodes at progress k:
  answering at k = D succeeds, answering earlier ends with `early_answer`, a fatal action
  ends with −1, advancing moves mass to k + 1, a detour keeps it at k; mass left after
  T_max steps is unanswered (−1).

  Returns:
    dict: success (P(R_out = +1), the accuracy), mean_outcome (E[R_out], the return),
    early_answer_rate, fatal_rate, truncated_rate, unanswerable_rate (no answer: fatal or
    truncated) and avg_steps.
  """
  probs = np.asarray(probs, np.float64)
  if probs.shape != (task.num_states, task.num_actions):
    raise ValueError(f"probs: expected shape [S, A]={(task.num_states, task.num_actions)}, "
                     f"got {probs.shape}")
  D = task.num_stages
  kinds = task.kinds()
  mass = np.zeros(D + 1)
  mass[0] = 1.0
  success = early = fatal = steps = 0.0
  for t in range(task.max_steps):
    steps += mass.sum()
    p = probs[np.arange(D + 1) * task.max_steps + t]  # [D + 1, A] at step t
    by_kind = {kind: mass * np.sum(np.where(kinds == kind, p, 0.0), axis=1)
               for kind in (ADVANCE, DETOUR, FATAL, ANSWER_KIND)}
    success += by_kind[ANSWER_KIND][D]
    early += by_kind[ANSWER_KIND][:D].sum()
    fatal += by_kind[FATAL].sum()
    mass = by_kind[DETOUR] + np.concatenate([[0.0], by_kind[ADVANCE][:D]])
  truncated = mass.sum()
  return dict(success=success, mean_outcome=success + task.early_answer * early - fatal - truncated,
              early_answer_rate=early, fatal_rate=fatal, truncated_rate=truncated,
              unanswerable_rate=fatal + truncated, avg_steps=steps)


def greedy_probs(log_probs: np.ndarray) -> np.ndarray:
  """[S, A] the deterministic policy that takes each state's most likely action."""
  out = np.zeros_like(np.asarray(log_probs, np.float64))
  out[np.arange(out.shape[0]), np.argmax(log_probs, axis=1)] = 1.0
  return out


def optimal_probs(task: ChainTask) -> np.ndarray:
  """[S, A] the optimal policy: the next chain tool at each progress, then the answer."""
  k = np.arange(task.num_states) // task.max_steps
  out = np.zeros((task.num_states, task.num_actions))
  out[np.arange(task.num_states), task.optimal_action()[k]] = 1.0
  return out


def optimal_value(task: ChainTask) -> dict[str, float]:
  """`policy_value` of the optimal policy: success 1 in D + 1 steps."""
  return policy_value(task, optimal_probs(task))

