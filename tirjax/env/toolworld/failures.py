"""Why a toolworld episode failed: its first departure from the task's ground-truth calls.

RL on toolworld's default has one lever that only outcomes can teach, the direction a question
states (`demos.confuse`); a sampled episode can fail for other reasons that RL must sharpen away
token by token. `failure_kind` names the first thing that went wrong, so that an evaluation can
say which of them bounds the sampled accuracy:

  format        a step whose calls did not parse (checks 1-3 of SPEC §6's format reward)
  direction     a call that is a ground-truth call with its direction flipped (`demos.flip`)
  miscopy       a call of a ground-truth tool that the tool refused (a name or value it does
                not know, a schema the arguments break: mostly a name copied wrong)
  argument      a call of a ground-truth tool that ran, with another argument than the plan's
                (another entity, field or value, a wrong reference)
  tool          a call of a tool the plan does not call (or of no tool: a misspelled name)
  repeat        a ground-truth call made again after all its copies were made
  no_answer     every call right, but no answer before the step cap (or the token budget)
  abstained     every call right, then "unable to answer" on an answerable task
  early_answer  an answer before every ground-truth call was made
  wrong_answer  every ground-truth call made, and still a wrong answer
  unanswerable  a task whose tool is down (reference `UNABLE_TO_ANSWER`), not abstained from

Calls are compared as parsed JSON (`1 == 1.0`), in the order the episode made them; any valid
schedule of the plan matches, since the ground truth is a multiset of calls.
"""

from __future__ import annotations

from typing import Sequence

from tirjax.env.judge import says_unable
from tirjax.env.tools import UNABLE_TO_ANSWER, Task
from tirjax.env.toolworld.demos import flip

KINDS = ("format", "direction", "miscopy", "argument", "tool", "repeat", "no_answer",
         "abstained", "early_answer", "wrong_answer", "unanswerable")
# checks_passed from which a step's calls were read (checks 1-3); a call that then names no
# tool, breaks its schema or errors is judged by the calls' comparison, not as format.
PARSED = 3


def _take(calls: list, call: dict) -> bool:
  """Removes one copy of `call` from `calls`; whether there was one."""
  for k, c in enumerate(calls):
    if c == call:
      del calls[k]
      return True
  return False


def failure_kind(task: Task, results: Sequence, answered: bool, answer) -> str:
  """The first thing that went wrong in a failed episode of `task` (one of `KINDS`); call it
  on failures only (a success reads as `wrong_answer`).

  Args:
    task: a toolworld task (its `gt_calls` are the plan's calls, resolved).
    results: the episode's `StepResult`s in order (`EpisodeRecord.results`): their parsed
      `calls` and, one per call, `call_results` (`{"result"}` or `{"error"}`).
    answered: whether the episode gave a final answer.
    answer: that answer (None if it gave none).
  """
  if task.answer == UNABLE_TO_ANSWER:
    return "unanswerable"
  expected = [dict(c) for c in task.flat_gt_calls]
  made = []
  flipped = [flip(c) for c in expected]
  names = {c["name"] for c in expected}
  for step in results:
    if step.checks_passed < PARSED:
      return "format"
    for call, result in zip(step.calls, step.call_results):
      if _take(expected, call):
        made.append(call)
      elif call in made:
        return "repeat"
      elif call in flipped:
        return "direction"
      elif call["name"] in names:
        return "miscopy" if "error" in result else "argument"
      else:
        return "tool"
  if not answered or answer is None:
    return "no_answer"
  if says_unable(answer):
    return "abstained"
  return "early_answer" if expected else "wrong_answer"


def failure_shares(kinds: Sequence[str | None]) -> dict[str, float]:
  """`eval/failure/<kind>`: the share of all episodes (a success is None) that failed first by
  each kind; with the success rate they sum to 1."""
  if not kinds:
    return {}
  return {f"eval/failure/{k}": sum(x == k for x in kinds) / len(kinds) for k in KINDS}
