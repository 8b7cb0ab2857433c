"""Demonstrations for the supervised warm-start: trajectories as messages and as token ids.

A demo follows a valid schedule of the task's plan (the canonical one, or with probability
`p_reorder` another valid order), one assistant step per schedule step, each with a short think
text; tool responses come from executing the tools. Then it answers (`response_gen`, or
`<answer>` with the `answer_tag` protocol); a down tool makes it answer `unable_to_answer`.
Imperfect demos (kinds):

* "recover": one call of a step is made with a wrong argument (a misspelt name, an incompatible
  unit, a badly formatted date); the error comes back, and the next step repeats the right call.
  The failed step is context, not a target: it is out of the SFT loss (`"train": False`), so
  the policy learns to recover from the error without learning to make it.
* "detour": one extra, unnecessary but harmless look-up step (an unused field of an entity the
  question names).

A demonstrator may also be unsure which way the question points (`p_confuse`): in that share
of demos, every call whose direction the question states — `compare`'s max/min, `sort_list`'s
order, `filter_list`'s over/under, `convert`'s from/to — takes its direction at random, and the
demo goes on with what that call returned (its answer is then wrong half the time). The
policy learns from such demos how to compare, sort, filter and convert, but not which way:
only the outcome of its own attempts can teach that (RL).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import random
from typing import Any, Optional, Sequence

from tirjax import option_checks
from tirjax.env import chat
from tirjax.env.tools import UNABLE_TO_ANSWER, Task
from tirjax.env.toolworld.plan import (canonical_schedule, format_answer, random_schedule,
                                       resolve, run_call)
from tirjax.env.toolworld.queries import CITY_NOUN
from tirjax.env.toolworld.toolbox import UNAVAILABLE, UNITS
from tirjax.env.toolworld.world import CITY_FIELDS, COMPANY_FIELDS, PERSON_FIELDS

KINDS = ("correct", "recover", "detour")
_LOOKUP_FIELDS = {"person_info": PERSON_FIELDS, "company_info": COMPANY_FIELDS,
                  "city_info": CITY_FIELDS}
_CORRUPTIBLE = (*_LOOKUP_FIELDS, "distance", "convert", "date_diff")
_UNIT_PAIRS = {("c", "f"), ("f", "c"), ("km", "mi"), ("mi", "km"), ("m", "ft"), ("ft", "m"),
               ("kg", "lb"), ("lb", "kg")}


@dataclasses.dataclass(frozen=True)
class DemoOptions:
  """Attributes:
    p_recover: share of demos with a failed call followed by the right one.
    p_detour: share of demos with one unnecessary look-up step.
    p_reorder: share of demos that follow a random valid order instead of the canonical one
      (only plans with independent calls have another order).
    p_confuse: share of demos whose direction-bearing calls take a random direction (see the
      module docstring).
    answer_protocol: "response_gen" or "answer_tag".
  """

  p_recover: float = 0.15
  p_detour: float = 0.1
  p_reorder: float = 0.3
  answer_protocol: str = "response_gen"
  p_confuse: float = 0.0

  def __post_init__(self):
    for name in ("p_recover", "p_detour", "p_reorder", "p_confuse"):
      option_checks.lies_in(name, getattr(self, name), 0, 1)
    option_checks.at_most("p_recover + p_detour", self.p_recover + self.p_detour, 1)
    option_checks.one_of("answer_protocol", self.answer_protocol, chat.ANSWER_PROTOCOLS)


@dataclasses.dataclass
class Demo:
  task_id: str
  kind: str  # one of KINDS
  messages: list[dict]  # system, user, then assistant / tool turns
  tools: list[dict]  # the tool specs of the system prompt
  answer: str  # the final answer the demo gives


def describe(call: dict) -> str:
  """A short think sentence for one call of ours."""
  name, a = call["name"], call["arguments"]
  if name == "person_info":
    return {"city": "Find where {} lives.", "company": "Find {}'s company.",
            "born": "Find when {} was born."}[a["field"]].format(a["name"])
  if name == "company_info":
    return {"hq": "Find where {} is based.", "revenue": "Find the revenue of {}.",
            "staff": "Find the staff of {}."}[a["field"]].format(a["name"])
  if name == "city_info":
    return f"Find {CITY_NOUN[a['field']]} of {a['name']}."
  if name == "distance":
    return f"Find the distance from {a['city_a']} to {a['city_b']}."
  if name == "calculate":
    return {"add": "Add {a} and {b}.", "sub": "Subtract {b} from {a}.",
            "mul": "Multiply {a} by {b}.", "div": "Divide {a} by {b}."}[a["op"]].format(**a)
  if name == "convert":
    return f"Convert {a['value']} {a['from_unit']} to {a['to_unit']}."
  if name == "compare":
    return f"Pick the {'largest' if a['mode'] == 'max' else 'smallest'} value."
  if name == "sort_list":
    return f"Sort by value, {'highest' if a['order'] == 'desc' else 'lowest'} first."
  if name == "filter_list":
    return f"Keep the values {'over' if a['op'] == 'gt' else 'under'} {a['value']}."
  if name == "date_diff":
    return f"Count the days from {a['start']} to {a['end']}."
  raise ValueError(f"describe: no description for tool {name!r}")


_DIRECTIONS = {"compare": ("mode", ("max", "min")), "sort_list": ("order", ("desc", "asc")),
               "filter_list": ("op", ("gt", "lt"))}


def confuse(call: dict, rng: random.Random) -> dict:
  """`call` with its direction drawn at random (unchanged for a call without one)."""
  name, args = call["name"], dict(call["arguments"])
  if name in _DIRECTIONS:
    key, values = _DIRECTIONS[name]
    args[key] = rng.choice(values)
  elif name == "convert" and rng.random() < 0.5:
    args["from_unit"], args["to_unit"] = args["to_unit"], args["from_unit"]
  else:
    return call
  return {"name": name, "arguments": args}


_FLIPS = {"mode": {"max": "min", "min": "max"}, "order": {"desc": "asc", "asc": "desc"},
          "op": {"gt": "lt", "lt": "gt"}}


def flip(call: dict) -> dict:
  """`call` with the other direction (`confuse`'s choice made wrong on purpose); a call
  without a direction unchanged."""
  name, args = call["name"], dict(call["arguments"])
  if name == "convert":
    args["from_unit"], args["to_unit"] = args["to_unit"], args["from_unit"]
  elif name in _DIRECTIONS:
    key = _DIRECTIONS[name][0]
    args[key] = _FLIPS[key][args[key]]
  else:
    return call
  return {"name": name, "arguments": args}


def direction_steps(task: Task, answer_protocol: str = "response_gen"
                    ) -> Optional[tuple[list[dict], list[dict], str, str]]:
  """(context messages, tool specs, the step as demonstrated, the step flipped) for the first
  step of `task`'s correct demonstration that takes a direction; None when no such step is
  reached (no direction in the plan, or a down tool ends the demo first). The flipped step's
  think text follows its calls, as a confused demonstration's does."""
  options = DemoOptions(p_recover=0, p_detour=0, p_reorder=0, answer_protocol=answer_protocol)
  demo = make_demo(task, random.Random(0), options)
  plan, down = task.metadata["plan"], task.metadata["down"]
  steps = [[plan[i] for i in step] for step in canonical_schedule(plan)]
  for s, step in enumerate(steps):
    if any(c["name"] == down for c in step):
      return None
    if any(c["name"] in _DIRECTIONS or c["name"] == "convert" for c in step):
      i = 2 + 2 * s  # system, user, then an assistant and a tool message per step
      content = demo.messages[i]["content"]
      calls = json.loads(content[content.index("<tool_call>") + 11:content.rindex("</tool_call>")])
      flipped = [flip(c) for c in calls]
      wrong = chat.format_step(" ".join(describe(c) for c in flipped), flipped)
      return demo.messages[:i], demo.tools, demo.messages[i]["content"], wrong
  return None


def _misspell(name: str, rng: random.Random) -> str:
  i = rng.randrange(1, len(name))
  return name[:i] + name[i + 1:]


def corrupt(call: dict, rng: random.Random) -> dict:
  """A schema-valid but wrong version of a call of a `_CORRUPTIBLE` tool (its tool errors)."""
  name, args = call["name"], dict(call["arguments"])
  if name in _LOOKUP_FIELDS:
    args["name"] = _misspell(args["name"], rng)
  elif name == "distance":
    key = rng.choice(("city_a", "city_b"))
    args[key] = _misspell(args[key], rng)
  elif name == "convert":
    args["to_unit"] = rng.choice([u for u in UNITS if u != args["from_unit"]
                                  and (args["from_unit"], u) not in _UNIT_PAIRS])
  elif name == "date_diff":
    key = rng.choice(("start", "end"))
    args[key] = datetime.date.fromisoformat(args[key]).strftime("%d/%m/%Y")
  else:
    raise ValueError(f"corrupt: no wrong version of tool {name!r}; use one of {_CORRUPTIBLE}")
  return {"name": name, "arguments": args}


def _detours(task: Task, down: Optional[str]) -> list[dict]:
  """Look-ups of unused fields of the entities the question names."""
  used = {(c["name"], c["arguments"]["name"], c["arguments"]["field"])
          for c in task.metadata["plan"]
          if c["name"] in _LOOKUP_FIELDS and isinstance(c["arguments"]["name"], str)}
  named = set()
  for c in task.metadata["plan"]:
    a = c["arguments"]
    if c["name"] in _LOOKUP_FIELDS and isinstance(a["name"], str):
      named.add((c["name"], a["name"]))
    if c["name"] == "distance":
      named.update(("city_info", a[k]) for k in ("city_a", "city_b") if isinstance(a[k], str))
  return [{"name": tool, "arguments": {"name": entity, "field": field}}
          for tool, entity in sorted(named) if tool != down
          for field in _LOOKUP_FIELDS[tool] if (tool, entity, field) not in used]


def _imperfection(task: Task, schedule: list[list[int]], reached: int, rng: random.Random,
                  options: DemoOptions):
  """(kind, wrong, detour): wrong = (step, plan index) of the call first made wrong; detour =
  (position, call) of the extra step. A kind that the task cannot show falls back to "correct"."""
  plan, down = task.metadata["plan"], task.metadata["down"]
  u = rng.random()
  if u < options.p_recover:
    candidates = [(s, i) for s, step in enumerate(schedule[:reached])
                  if all(plan[j]["name"] != down for j in step) for i in step
                  if plan[i]["name"] in _CORRUPTIBLE]
    if candidates:
      return "recover", rng.choice(candidates), None
  elif u < options.p_recover + options.p_detour:
    detour_calls = _detours(task, down)
    if detour_calls:
      # before any step, or before the answer; never after a down tool failed
      return "detour", None, (rng.randrange(reached + (down is None)), rng.choice(detour_calls))
  return "correct", None, None


def make_demo(task: Task, rng: random.Random, options: DemoOptions = DemoOptions()) -> Demo:
  """One demonstration of `task` (see the module docstring)."""
  plan: list[dict] = task.metadata["plan"]
  down = task.metadata["down"]
  tools = {t.name: t for t in task.tools}
  schedule = (random_schedule(plan, rng) if rng.random() < options.p_reorder
              else canonical_schedule(plan))
  # Steps that run: a down tool ends the trajectory at the first step that calls it.
  reached = next((s + 1 for s, step in enumerate(schedule)
                  if any(plan[i]["name"] == down for i in step)), len(schedule))
  kind, wrong, detour = _imperfection(task, schedule, reached, rng, options)
  confused = options.p_confuse > 0 and rng.random() < options.p_confuse

  messages = chat.prompt_messages(task.question, options.answer_protocol)
  results: dict[int, Any] = {}

  def emit(think: str, calls: Sequence[dict], train: bool = True) -> list[dict]:
    entries = [run_call(tools, c) for c in calls]
    messages.append({"role": "assistant", "content": chat.format_step(think, calls),
                     **({} if train else {"train": False})})
    messages.append({"role": "tool", "content": chat.tool_response_content(entries)})
    return entries

  failed = None
  for s, step in enumerate(schedule[:reached]):
    if detour and detour[0] == s:
      emit(describe(detour[1]), [detour[1]])
    calls = [{"name": plan[i]["name"], "arguments": resolve(plan[i]["arguments"], results)}
             for i in step]
    if confused:
      calls = [confuse(c, rng) for c in calls]
    if wrong and wrong[0] == s:
      k = step.index(wrong[1])
      sent = calls[:k] + [corrupt(calls[k], rng)] + calls[k + 1:]
      entries = emit(" ".join(describe(c) for c in sent), sent, train=False)
      entries[k] = emit(f"Retry. {describe(calls[k])}", [calls[k]])[0]
    else:
      entries = emit(" ".join(describe(c) for c in calls), calls)
    for i, e in zip(step, entries):
      if "result" in e:
        results[i] = e["result"]
      elif e["error"] == UNAVAILABLE:
        failed = e["name"]
  if detour and detour[0] == reached:
    emit(describe(detour[1]), [detour[1]])
  if failed:
    answer, think = UNABLE_TO_ANSWER, f"{failed} is unavailable, so I cannot answer."
  else:
    answer = format_answer(results[len(plan) - 1])
    think = f"The answer is {answer}."
  messages.append({"role": "assistant",
                   "content": chat.format_answer_step(think, answer, options.answer_protocol)})
  return Demo(task.task_id, kind, messages, chat.tool_specs(task.tools, options.answer_protocol),
              answer)


def make_demos(tasks: Sequence[Task], seed: int = 0,
               options: DemoOptions = DemoOptions()) -> list[Demo]:
  """One demo per task, each from its own `random.Random` (deterministic per task and seed)."""
  return [make_demo(t, random.Random(f"{seed}:{t.task_id}"), options) for t in tasks]


def demo_tokens(tokenizer, demo: Demo) -> tuple[list[int], list[int]]:
  """Token ids of the rendered demo and the loss mask (1 on assistant turns and their end)."""
  return chat.encode_conversation(tokenizer, demo.messages, demo.tools)
