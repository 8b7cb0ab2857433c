"""Finished rows → the padded `Rollouts` arrays (spec §2) and host-side episode records.

Shapes come from `Shapes` (B, T, K, C, L, P), never from the data, so every batch of a run has
one shape. Node ids are batch-global and numbered in order of first appearance; rows that share
a node object share its id (and its tokens). Anchor states (`state_id`, GiGPO) key each step by
what its tool calls and tool responses (or next user turn) were, never by the policy's text.
Padding rows have `row_valid = False`, `group_id = 0` and no tokens.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Optional, Sequence

import numpy as np

from tirjax.env.call_arrays import encode_row, stack_rows
from tirjax.env.executor import EpisodeSummary, StepResult
from tirjax.env.judge import OUTCOME, Judgement, Trajectory
from tirjax.env.tools import Task
from tirjax.matching.encoding import CallEncoder, direction_slots
from tirjax.matching.similarity import call_similarity, strict_call_similarity
from tirjax.episodes.episode import ANSWERED, Episode
from tirjax.episodes.options import Shapes
from tirjax.rollouts import Rollouts, empty_arrays, from_numpy, state_ids, write_tokens


@dataclasses.dataclass
class EpisodeRecord:
  """One row, host side: what metrics and debugging need."""

  row: int  # index in the batch
  group: int  # query index (= group_id)
  task_id: str
  status: str  # "answered", "max_steps" or "truncated"
  texts: list  # decoded step texts
  results: list  # [StepResult] per step
  node_uids: list  # the runner's node uids along the row
  answer: Optional[str]
  verdict: str
  judgement: Optional[Judgement]  # when the judge returned one
  outcome: float  # R_out
  num_tokens: int
  summary: EpisodeSummary  # for tirjax.env.metrics

  @property
  def trajectory_steps(self) -> list[tuple[str, str]]:
    return [(t, r.response_content) for t, r in zip(self.texts, self.results)]


def trajectory(task: Task, ep: Episode) -> Optional[Trajectory]:
  """What the judge sees; None for a row that did not answer."""
  if ep.status != ANSWERED:
    return None
  return Trajectory(question=task.question,
                    steps=tuple((n.text, n.result.response_content) for n in ep.steps),
                    answer=ep.steps[-1].result.answer, reference=task.answer)


def summary(task: Task, ep: Episode) -> EpisodeSummary:
  results: list[StepResult] = [n.result for n in ep.steps]
  return EpisodeSummary(
      task_id=task.task_id, num_steps=len(results), answered=ep.status == ANSWERED,
      answer=results[-1].answer if ep.status == ANSWERED else None,
      format_rewards=tuple(r.format_reward for r in results),
      num_calls=sum(len(r.calls) for r in results),
      num_solved=sum(sum(r.call_solves) for r in results),
      num_expected=sum(len(v) for v in (task.expected or {}).values()))


def step_key(result: StepResult) -> str:
  """What a step left in the context for the next one, the policy's text left out: its parsed
  calls and the tool response (or the next user turn) that came back."""
  return json.dumps([result.calls, result.response_content, result.user_message],
                    sort_keys=True, default=str)


def to_rollouts(rows: Sequence[tuple[int, Episode]], tasks: Sequence[Task],
                prompts: Sequence[Sequence[int]], verdicts: Sequence[str],
                shapes: Shapes, greedy: Optional[Sequence[float]] = None,
                strict_directions: bool = False) -> Rollouts:
  """Pads `rows` (query index, finished episode) with their verdicts into a validated batch.

  `greedy`: per query, the R_out of its greedy rollout (ReMax's baseline), written into
  `greedy_outcome` of the query's rows; None leaves the field out. `strict_directions`:
  `call_sim` is the strict similarity (`RolloutOptions.strict_directions`).
  """
  B, T, K, C, L, P = (shapes.num_rows, shapes.max_steps, shapes.max_calls, shapes.max_gt_calls,
                      shapes.max_tokens, shapes.max_params)
  if len(rows) > B:
    raise ValueError(f"shapes.num_rows={B} is too small for {len(rows)} rows")
  a = empty_arrays(B, T, K, C, L, optional=("num_expected",) + (
      () if greedy is None else ("greedy_outcome",)))
  encoder = CallEncoder()
  keys: dict[str, int] = {}
  step_keys = np.zeros((B, T), np.int64)
  # Dialogue rows: a step's calls are matched only against the ground truth of its user turn.
  same_turn = np.ones((B, T, C), bool)
  node_ids: dict[int, int] = {}
  call_rows = []
  gt_direction = np.zeros((B, C, P), bool)  # the strict similarity's mask
  for b, ((q, ep), verdict) in enumerate(zip(rows, verdicts)):
    task, steps = tasks[q], ep.steps
    if len(steps) > T:
      raise ValueError(f"shapes.max_steps={T} is too small: a row of task {task.task_id} "
                       f"has {len(steps)} steps")
    a["group_id"][b], a["row_valid"][b] = q, True
    a["outcome"][b] = OUTCOME[verdict]
    a["answer_score"][b] = float(verdict == "true")
    a["num_steps"][b] = len(steps)
    a["answered"][b] = ep.status == ANSWERED
    a["step_valid"][b, :len(steps)] = True
    a["policy_version"][b] = min((n.policy_version for n in steps), default=0)
    a["num_expected"][b] = sum(len(v) for v in (task.expected or {}).values())
    if greedy is not None:
      a["greedy_outcome"][b] = greedy[q]
    pos = write_tokens(a, b, 0, prompts[q])
    for t, node in enumerate(steps):
      a["node_id"][b, t] = node_ids.setdefault(node.uid, len(node_ids))
      a["format_reward"][b, t] = node.result.format_reward
      step_keys[b, t] = keys.setdefault(step_key(node.result), len(keys))
      pos = write_tokens(a, b, pos, node.tokens, node.logprobs, t)
      pos = write_tokens(a, b, pos, node.response)
    if task.dialogue is not None:
      gt_turn = np.full(C, -1, np.int32)
      gt_turn[:len(task.dialogue.gt_call_turns)] = task.dialogue.gt_call_turns
      step_turn = np.array([n.result.turn for n in steps], np.int32)
      same_turn[b, :len(steps)] = step_turn[:, None] == gt_turn[None, :]
    if strict_directions:
      if task.direction_params is None:
        raise ValueError(f"rollout.strict_directions: task {task.task_id} names no direction "
                         "parameters (Task.direction_params); its environment has none")
      for c, call in enumerate(task.flat_gt_calls[:C]):
        gt_direction[b, c] = direction_slots(call, P, task.direction_params)
    call_rows.append(encode_row(
        encoder, [n.result.calls for n in steps], task.flat_gt_calls, max_steps=T,
        max_calls=K, max_gt_calls=C, max_params=P,
        step_solves=[n.result.call_solves for n in steps]))
  while len(call_rows) < B:
    if task.dialogue is not None:
      gt_turn = np.full(C, -1, np.int32)
      gt_turn[:len(task.dialogue.gt_call_turns)] = task.dialogue.gt_call_turns
      step_turn = np.array([n.result.turn for n in steps], np.int32)
      same_turn[b, :len(steps)] = step_turn[:, None] == gt_turn[None, :]
    call_rows.append(encode_row(encoder, [], [], max_steps=T, max_calls=K, max_gt_calls=C,
                                max_params=P))
  calls, call_valid, gt_valid, call_solves = stack_rows(call_rows)
  sim = (strict_call_similarity(calls, call_valid, gt_valid, gt_direction) if strict_directions
         else call_similarity(calls, call_valid, gt_valid)) * same_turn[:, :, None, :]
  a.update(call_valid=call_valid, gt_valid=gt_valid, call_sim=sim, call_solves=call_solves,
           state_id=state_ids(a["group_id"], step_keys, a["step_valid"]),
           **{f"calls.{f.name}": getattr(calls, f.name) for f in dataclasses.fields(calls)})
  return from_numpy(a)


