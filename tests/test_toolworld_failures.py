"""toolworld failure kinds: each failure the classifier names, built by changing one thing in a
task's ground-truth steps and running them through the real executor (the calls it compares
are what the parser read from the step text), plus the order- and number-insensitive cases."""

import random
import types

import pytest

from tirjax.env import chat
from tirjax.env.executor import ToolEnv, ToolEnvOptions
from tirjax.env.tools import UNABLE_TO_ANSWER
from tirjax.env.toolworld import Difficulty, make_tasks
from tirjax.env.toolworld.demos import corrupt, flip
from tirjax.env.toolworld.failures import (KINDS, RIGHT, failure_kind, failure_shares,
                                           turn_labels)
from tirjax.env.toolworld.world import COMPANY_FIELDS, PERSON_FIELDS

PROTOCOL = "answer_tag"
LOOKUPS = ("person_info", "company_info")


@pytest.fixture(scope="module")
def tasks():
  return [t for t in make_tasks("train", 60, seed=3, difficulty=Difficulty(p_direction=1.0,
                                                                            p_down=0.0))]


def run(task, step_calls, answer=None):
  """Runs one step per entry of `step_calls` (a list of calls) and then, if `answer` is given,
  an answering step, through the executor; returns (results, answered, answer)."""
  env = ToolEnv(task, ToolEnvOptions(max_steps=12, answer_protocol=PROTOCOL))
  results = [env.step(chat.format_step("thinking", calls)) for calls in step_calls]
  if answer is not None:
    results.append(env.step(chat.format_answer_step("done", answer, PROTOCOL)))
  return results, env.answered, env.answer


def gt_steps(task):
  """The ground-truth calls of each step (the canonical schedule), as fresh lists."""
  return [[dict(c) for c in step] for step in task.gt_calls]


def with_direction(tasks):
  return next(t for t in tasks if any(flip(c) != c for c in t.flat_gt_calls))


def test_a_correct_run_without_its_answer_made_every_call(tasks):
  for task in tasks[:20]:
    results, answered, answer = run(task, gt_steps(task))
    assert failure_kind(task, results, answered, answer) == "no_answer", task.task_id


def test_each_departure_is_named(tasks):
  task = with_direction(tasks)
  steps = gt_steps(task)
  s, k = next((s, k) for s, step in enumerate(steps) for k, c in enumerate(step)
              if flip(c) != c)
  flipped = [list(step) for step in steps]
  flipped[s][k] = flip(steps[s][k])
  assert failure_kind(task, *run(task, flipped, "1")) == "direction"
  assert failure_kind(task, *run(task, steps, "surely not this")) == "wrong_answer"
  assert failure_kind(task, *run(task, steps, "I cannot answer this.")) == "abstained"
  assert failure_kind(task, *run(task, steps[:-1], "1")) == "early_answer"
  assert failure_kind(task, *run(task, steps + [steps[0]], "1")) == "repeat"
  unknown = [[{"name": "teleport", "arguments": {}}]]
  assert failure_kind(task, *run(task, unknown, "1")) == "tool"
  results, answered, answer = run(task, steps, "1")
  assert failure_kind(task, [types.SimpleNamespace(checks_passed=2, calls=[], call_results=[])] + results,
                      answered, answer) == "format"


def test_a_refused_miscopy_and_a_wrong_argument_that_ran_differ(tasks):
  task = next(t for t in tasks if any(c["name"] in LOOKUPS for c in t.flat_gt_calls))
  steps = gt_steps(task)
  s, k = next((s, k) for s, step in enumerate(steps) for k, c in enumerate(step)
              if c["name"] in LOOKUPS)
  miscopied = [list(step) for step in steps]
  miscopied[s][k] = corrupt(steps[s][k], random.Random(1))  # a misspelled name: refused
  assert failure_kind(task, *run(task, miscopied[:s + 1], "1")) == "miscopy"
  call = steps[s][k]
  fields = PERSON_FIELDS if call["name"] == "person_info" else COMPANY_FIELDS
  other = next(f for f in fields if f != call["arguments"]["field"])
  steps[s][k] = {"name": call["name"], "arguments": {**call["arguments"], "field": other}}
  results, answered, answer = run(task, steps[:s + 1], "1")
  assert "result" in results[s].call_results[k]  # the tool ran it
  assert failure_kind(task, results, answered, answer) == "argument"


def test_order_and_number_spelling_do_not_matter(tasks):
  task = next(t for t in tasks if len(t.gt_calls[0]) > 1)
  steps = gt_steps(task)
  steps[0] = steps[0][::-1]  # parallel calls in the other order
  assert failure_kind(task, *run(task, steps, "surely not this")) == "wrong_answer"
  call = {"name": "f", "arguments": {"x": 1}}
  twin = types.SimpleNamespace(answer="7", flat_gt_calls=[call])
  step = types.SimpleNamespace(checks_passed=5, calls=[{"name": "f", "arguments": {"x": 1.0}}],
                               call_results=[{"name": "f", "result": 2}])
  assert failure_kind(twin, [step], True, "8") == "wrong_answer"


def test_a_down_task_fails_as_unanswerable():
  task = make_tasks("train", 1, seed=0, difficulty=Difficulty(p_down=1.0))[0]
  assert task.answer == UNABLE_TO_ANSWER
  assert failure_kind(task, [], True, "42") == "unanswerable"


def test_shares_sum_with_the_successes_to_one():
  kinds = [None, "direction", "direction", "format", None]
  shares = failure_shares(kinds)
  assert set(shares) == {f"eval/failure/{k}" for k in KINDS}
  assert shares["eval/failure/direction"] == pytest.approx(0.4)
  assert sum(shares.values()) + kinds.count(None) / len(kinds) == pytest.approx(1.0)
  assert failure_shares([]) == {}


def labels(task, step_calls, answer, verdict):
  results, answered, _ = run(task, step_calls, answer)
  return turn_labels(task, results, answered, verdict)


def test_every_turn_is_labelled_not_only_the_first_departure(tasks):
  task = with_direction(tasks)
  steps = gt_steps(task)
  n = len(steps)
  assert labels(task, steps, "1", "true") == [RIGHT] * (n + 1)
  assert labels(task, steps, "1", "false") == [RIGHT] * n + ["answer"]
  s, k = next((s, k) for s, step in enumerate(steps) for k, c in enumerate(step)
              if flip(c) != c)
  flipped = [list(step) for step in steps]
  flipped[s][k] = flip(steps[s][k])
  # the flipped step is wrong; the steps after it are judged on their own calls (the plan's)
  want = [RIGHT] * n + ["answer"]
  want[s] = "direction"
  assert labels(task, flipped, "1", "false") == want
  unknown = [{"name": "teleport", "arguments": {}}]
  assert labels(task, [unknown] + steps + [steps[0]], "1", "false") == (
      ["tool"] + [RIGHT] * n + ["repeat", "answer"])
  assert labels(task, [steps[0]], None, "false") == [RIGHT]  # no answer: no answering turn


def test_a_call_that_follows_a_wrong_direction_correctly_is_wrong():
  """The declared convention (module docstring): on a knockout chain whose first compare is
  flipped, the later steps made right on the branch it named (the look-up of that city, its
  compare, the add of that branch's winning values) are "argument", not right."""
  from tirjax.env.toolworld import plan as plan_lib  # pylint: disable=import-outside-toplevel
  tasks = make_tasks("train", 20, seed=0, difficulty=Difficulty(
      chain_directions=2, chain_family="knockout", p_down=0.0))
  # meetings on two fields, so that no branch look-up repeats a plan call already made
  task = next(t for t in tasks
              if len({c["arguments"].get("field") for c in t.flat_gt_calls} - {None}) == 2)
  plan = task.metadata["plan"]
  wrong = [flip(c) if c["name"] == "compare" and i == 2 else c for i, c in enumerate(plan)]
  branch = plan_lib.execute(wrong, task.tools, plan_lib.canonical_schedule(plan))
  assert not branch.error and len(branch.steps) == len(task.gt_calls) == 5
  answer = plan_lib.format_answer(branch.results[len(plan) - 1])
  assert answer != task.answer
  assert labels(task, branch.steps, answer, "false") == [
      RIGHT, "direction", "argument", "argument", "argument", "answer"]
  assert labels(task, gt_steps(task), task.answer, "true") == [RIGHT] * 6


def test_a_step_with_one_wrong_call_among_right_ones_is_wrong(tasks):
  task = next(t for t in tasks if len(t.gt_calls[0]) > 1
              and any(c["name"] in LOOKUPS for c in t.gt_calls[0]))
  steps = gt_steps(task)
  k = next(k for k, c in enumerate(steps[0]) if c["name"] in LOOKUPS)
  steps[0][k] = corrupt(steps[0][k], random.Random(1))
  assert labels(task, steps, "1", "false")[0] == "miscopy"


def test_format_and_the_best_verdict_of_an_unanswerable_task():
  task = make_tasks("train", 1, seed=0, difficulty=Difficulty(p_down=1.0))[0]
  unparsed = types.SimpleNamespace(checks_passed=2, calls=[], call_results=[])
  answer = types.SimpleNamespace(checks_passed=5, calls=[], call_results=[])
  assert turn_labels(task, [unparsed, answer], True, "unable_to_answer") == ["format", RIGHT]
  assert turn_labels(task, [unparsed, answer], True, "true") == ["format", "answer"]
  # a step that parsed but called nothing (and did not answer) made no progress
  assert turn_labels(task, [answer, answer], True, "unable_to_answer") == ["format", RIGHT]
