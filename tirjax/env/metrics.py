"""Evaluation metrics of finished episodes (spec §6).

PORTool's four axes (PORTool §4): accuracy (fraction judged correct), average tool-call steps
(T_j, the answering step included, so at most T_max), unanswerable rate (no `response_gen`
within T_max) and average formatting reward (mean R_fm over a trajectory's steps, then over
queries). FTRL's Solve-P / Solve-R / Solve-F1 (HiDiffTIR Appendix A.1, Eq. 18-20) and
ToolHop's answer correctness (the gold answer contained in the final response).

Every metric is a mean over queries: episodes of one query (`task_id`) are averaged first,
so that a query sampled several times weighs as much as one sampled once.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Optional, Sequence

from tirjax.env import verify
from tirjax.env.executor import EpisodeSummary
from tirjax.env.judge import says_unable


def query_mean(task_ids: Sequence[str], values: Sequence[float]) -> float:
  """Mean over queries of the mean over each query's values."""
  if len(task_ids) != len(values):
    raise ValueError(f"task_ids / values: lengths differ ({len(task_ids)} vs {len(values)})")
  if not values:
    raise ValueError("values: need at least one episode")
  groups: dict[str, list[float]] = defaultdict(list)
  for q, v in zip(task_ids, values):
    groups[q].append(float(v))
  return sum(sum(v) / len(v) for v in groups.values()) / len(groups)


def solve_scores(n_match: int, n_gen: int, n_gt: int) -> tuple[float, float, float]:
  """(Solve-P, Solve-R, Solve-F1) of one trajectory, HiDiffTIR Eq. 18-20:
  P = N_match / N_gen (1 if N_gen = 0), R = N_match / N_gt, F1 = 2 N_match / (N_gen + N_gt)."""
  if n_gt < 1:
    raise ValueError(f"n_gt: a query needs at least one expected answer, got {n_gt}")
  if not 0 <= n_match <= min(n_gen, n_gt):
    raise ValueError(f"n_match: must lie in [0, min(n_gen, n_gt)], got {n_match} "
                     f"(n_gen={n_gen}, n_gt={n_gt})")
  precision = n_match / n_gen if n_gen > 0 else 1.0
  return precision, n_match / n_gt, 2.0 * n_match / (n_gen + n_gt)


def answer_correctness(response: Optional[str], gold: str,
                       tool_message: Optional[str] = None) -> float:
  """ToolHop AC (its paper's Eq. 21): 1 if the gold answer is contained in the final response.

  With `tool_message` (the tool response just before the answer), FTRL's reference scorer's
  rule (bytedance/FTRL, `Code/evaluation/evaluation_toolhop.py`): an answer that fails is still
  correct when that message contains the gold. Containment as FTRL's `answer_verify`: every
  ", "-separated part of the gold, lower-cased and without commas, is a substring.
  """
  if response is None or not response.strip():
    return 0.0
  if verify.contains_answer(response, gold):
    return 1.0
  return float(tool_message is not None and verify.contains_answer(tool_message, gold))


def portool_metrics(episodes: Sequence[EpisodeSummary], outcomes: Sequence[float],
                    step_cap: Optional[int] = None) -> dict[str, float]:
  """accuracy, avg_tool_steps (capped at `step_cap` if given), unanswerable_rate, avg_format,
  and abstain_rate (beyond PORTool's axes: the share of rows whose final answer says the
  question cannot be answered, `judge.says_unable`; the reward's abstention trap shows here)."""
  if len(episodes) != len(outcomes):
    raise ValueError(f"episodes / outcomes: lengths differ ({len(episodes)} vs "
                     f"{len(outcomes)})")
  ids = [e.task_id for e in episodes]
  cap = step_cap if step_cap is not None else max((e.num_steps for e in episodes), default=0)
  stepped = [e for e in episodes if e.format_rewards]
  return {
      "accuracy": query_mean(ids, [float(o == 1) for o in outcomes]),
      "avg_tool_steps": query_mean(ids, [min(e.num_steps, cap) for e in episodes]),
      "unanswerable_rate": query_mean(ids, [float(not e.answered) for e in episodes]),
      "abstain_rate": query_mean(ids, [float(e.answer is not None and says_unable(e.answer))
                                       for e in episodes]),
      "avg_format_reward": query_mean(
          [e.task_id for e in stepped],
          [sum(e.format_rewards) / len(e.format_rewards) for e in stepped]) if stepped else 0.0,
  }


def solve_metrics(episodes: Sequence[EpisodeSummary]) -> dict[str, float]:
  """Mean Solve-P, Solve-R and Solve-F1 over queries (FTRL episodes: `num_expected` > 0)."""
  scores = [solve_scores(e.num_solved, e.num_calls, e.num_expected) for e in episodes]
  ids = [e.task_id for e in episodes]
  return {name: query_mean(ids, [s[i] for s in scores])
          for i, name in enumerate(("solve_p", "solve_r", "solve_f1"))}
