"""Why a toolworld episode failed: its first departure from the task's ground-truth calls.

RL on toolworld's default has one lever that only outcomes can teach, the direction a question
states (`demos.confuse`); a sampled episode can fail for other reasons that RL must sharpen away
token by token. `failure_kind` names the first thing that went wrong, so that an evaluation can
say which of them bounds the sampled accuracy:

  format        a step whose calls did not parse (checks 1-3 of spec §4.1's format reward)
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

`turn_labels` applies the same rules to every step of an episode rather than to its first
departure only (spec §4.5's turn labels, for credit fidelity): a tool-call step is right when
each of its calls takes a not-yet-made call of the plan, else wrong with the kind of its first
call that does not; the answering step is right when its verdict is the best the task admits.

Convention (issue 51, item 5): a call is judged against the plan's calls as the task resolved
them, not against what its own inputs imply. So a call that correctly follows from an upstream
wrong direction (in a knockout chain: the look-up of the city a flipped compare named, the
compare of that city's branch, the `calculate` that adds the winning values of that branch)
is wrong, as "argument" (or "repeat" where it happens to repeat a plan call already made):
every turn after a wrong direction is blamed with it, and only the direction's own turn is
"direction". A label of "right given its input" would need the plan replayed on the
episode's own results; the oracle (spec §4.4) and the fidelity measures read these labels.
"""

from __future__ import annotations

from typing import Optional, Sequence

from tirjax.env.judge import says_unable
from tirjax.env.registry import RIGHT
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


class _Plan:
  """The plan's calls not yet made, and what a call of the episode is against them."""

  def __init__(self, task: Task):
    self.expected = [dict(c) for c in task.flat_gt_calls]
    self.made = []
    self.flipped = [flip(c) for c in self.expected]
    self.names = {c["name"] for c in self.expected}

  def take(self, call: dict, result: dict) -> Optional[str]:
    """None when `call` takes a not-yet-made call of the plan (which is then made), else the
    kind of what it got wrong: repeat, direction, miscopy, argument or tool, in that order."""
    if _take(self.expected, call):
      self.made.append(call)
      return None
    if call in self.made:
      return "repeat"
    if call in self.flipped:
      return "direction"
    if call["name"] in self.names:
      return "miscopy" if "error" in result else "argument"
    return "tool"


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
  plan = _Plan(task)
  for step in results:
    if step.checks_passed < PARSED:
      return "format"
    for call, result in zip(step.calls, step.call_results):
      kind = plan.take(call, result)
      if kind is not None:
        return kind
  if not answered or answer is None:
    return "no_answer"
  if says_unable(answer):
    return "abstained"
  return "early_answer" if plan.expected else "wrong_answer"


# Kinds of a wrong turn (`turn_labels`): a call's kinds above, a step that gave no parsed call
# ("format"), and an answering step whose verdict is not the best the task admits ("answer").
TURN_KINDS = ("format", "direction", "miscopy", "argument", "tool", "repeat", "answer")


def turn_labels(task: Task, results: Sequence, answered: bool, verdict: str) -> list[str]:
  """Each step's label: `RIGHT`, or the `TURN_KINDS` kind of what it got wrong (spec §4.5).

  Args:
    task: a toolworld task (its `gt_calls` are the plan's calls, resolved).
    results: the episode's `StepResult`s in order (`EpisodeRecord.results`).
    answered: whether the episode's last step gave its final answer.
    verdict: the judge's verdict of the episode ("true", "false", "unable_to_answer").

  A tool-call step is right when each of its calls takes a not-yet-made call of the plan
  (calls compared as parsed JSON, in the order made; wrong calls take nothing); else it is
  wrong with the kind of its first call that does not, as `failure_kind` names it. A step whose
  calls did not parse, or that made none, is "format". The answering step is right when the
  verdict is the best the task admits: "true", or "unable_to_answer" on a task that cannot be
  answered (spec §6: that verdict is earned only there); its calls, if any, are not labelled.
  """
  plan = _Plan(task)
  best = "unable_to_answer" if task.answer == UNABLE_TO_ANSWER else "true"
  labels = []
  for t, step in enumerate(results):
    if answered and t == len(results) - 1:
      labels.append(RIGHT if verdict == best else "answer")
      continue
    if step.checks_passed < PARSED or not step.calls:
      labels.append("format")
      continue
    kinds = [plan.take(call, result) for call, result in zip(step.calls, step.call_results)]
    labels.append(next((k for k in kinds if k is not None), RIGHT))
  return labels


def failure_shares(kinds: Sequence[str | None]) -> dict[str, float]:
  """`eval/failure/<kind>`: the share of all episodes (a success is None) that failed first by
  each kind; with the success rate they sum to 1."""
  if not kinds:
    return {}
  return {f"eval/failure/{k}": sum(x == k for x in kinds) / len(kinds) for k in KINDS}
