"""Verdicts of finished rows (spec §6): a judge sees the trajectory of each answered row.

A judge is any callable `Trajectory -> verdict` returning "true", "false" or
"unable_to_answer", or a `Judgement` (as `LLMJudge.judge` does). Rows that did not answer (T_max
reached, or truncated) get "false" without a call: R_out = −1.
"""

from __future__ import annotations

import concurrent.futures
from typing import Callable, Optional, Sequence, Union

from tirjax.env.judge import (VERDICTS, Judgement, LLMJudge, LLMJudgeOptions, RuleOptions,
                              Trajectory, rule_verdict)

Judge = Callable[[Trajectory], Union[str, Judgement]]


def rule_judge(options: RuleOptions = RuleOptions()) -> Judge:
  """The rule-based verifier against the task's reference answer."""

  def judge(trajectory: Trajectory) -> str:
    return rule_verdict(trajectory.answer, trajectory.reference, options)

  return judge


def judge_all(judge: Judge, trajectories: Sequence[Optional[Trajectory]],
              workers: int = 1) -> list[tuple[str, Optional[Judgement]]]:
  """(verdict, judgement or None) per trajectory; None (no answer) gives "false"."""

  def one(traj):
    if traj is None:
      return "false", None
    out = judge(traj)
    verdict = out.verdict if isinstance(out, Judgement) else out
    if verdict not in VERDICTS:
      raise ValueError(f"judge: returned {verdict!r}; a verdict is one of {VERDICTS}")
    return verdict, out if isinstance(out, Judgement) else None

  if workers == 1:
    return [one(t) for t in trajectories]
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    return list(pool.map(one, trajectories))


def make_judge(judge_cfg):
  """The rule-based verifier, or the LLM judge (five votes, majority) on an endpoint."""
  rule = RuleOptions(abstention=judge_cfg.abstention)
  if judge_cfg.kind == "rule":
    return rule_judge(rule)
  llm = LLMJudge(LLMJudgeOptions(base_url=judge_cfg.base_url, model=judge_cfg.model,
                                 votes=judge_cfg.votes), rule)
  return llm.judge
