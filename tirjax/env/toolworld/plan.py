"""Query plans: the ground-truth calls of a query, with arguments that refer to earlier results.

A plan is a list of calls `{"name", "arguments"}` in which an argument value (or a value nested
in an object) may be `{"$ref": i}`: the result of call i; a key of an object may be
`"$ref:i"` (`key_ref(i)`): the result of call i as a string, for an object keyed by an earlier
result (a `compare` whose items hold the winner of an earlier one, so that a demonstration that
took another branch keys its items by what that branch returned); and a value may be
`{"$pick": i, "items": {...}}` (`pick_ref(i, items)`): the value that result i labels among
`items` (a `compare`'s items, refs and all), so that a sum of winning values adds what the
branch taken won with. The last call is the plan's only sink;
its result is the answer. A *schedule* is a list of steps, each a list of call indices, such that
every call comes after the calls it refers to; calls of one step are independent (parallel).
The canonical schedule (the ground truth `Task.gt_calls`) runs every call as early as possible;
any other schedule is an equally valid order.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Mapping, Sequence

from tirjax.env.tools import Tool, ToolError

REF = "$ref"
KEY_REF = "$ref:"
PICK = "$pick"
Schedule = list[list[int]]


def ref(i: int) -> dict:
  return {REF: i}


def key_ref(i: int) -> str:
  return f"{KEY_REF}{i}"


def pick_ref(i: int, items: dict) -> dict:
  """The value of `items` (once resolved) under the label that call i returned."""
  return {PICK: i, "items": items}


def _key_index(key: Any) -> int | None:
  """i for a key `"$ref:i"`, else None."""
  if isinstance(key, str) and key.startswith(KEY_REF) and key[len(KEY_REF):].isdigit():
    return int(key[len(KEY_REF):])
  return None


def _is_ref(v: Any) -> bool:
  return isinstance(v, dict) and len(v) == 1 and REF in v


def _is_pick(v: Any) -> bool:
  return isinstance(v, dict) and set(v) == {PICK, "items"}


def refs_in(value: Any) -> set[int]:
  if _is_ref(value):
    return {value[REF]}
  if _is_pick(value):
    return {value[PICK]} | refs_in(value["items"])
  if isinstance(value, dict):
    keys = {i for i in map(_key_index, value) if i is not None}
    return keys.union(*(refs_in(v) for v in value.values()))
  if isinstance(value, list):
    return set().union(*(refs_in(v) for v in value))
  return set()


def resolve(value: Any, results: Mapping[int, Any]) -> Any:
  """`value` with every `{"$ref": i}` replaced by `results[i]`, and every key `"$ref:i"` by
  `str(results[i])`, and every `pick_ref(i, items)` by the resolved items' value under
  `str(results[i])` (a KeyError names the label when they hold none)."""
  if _is_ref(value):
    return results[value[REF]]
  if _is_pick(value):
    items, label = resolve(value["items"], results), str(results[value[PICK]])
    if label not in items:
      raise KeyError(f"pick_ref({value[PICK]}): no item {label!r} in {sorted(items)}")
    return items[label]
  if isinstance(value, dict):
    return {k if _key_index(k) is None else str(results[_key_index(k)]): resolve(v, results)
            for k, v in value.items()}
  if isinstance(value, list):
    return [resolve(v, results) for v in value]
  return value


def dependencies(calls: Sequence[Mapping[str, Any]]) -> list[set[int]]:
  return [refs_in(c["arguments"]) for c in calls]


def canonical_schedule(calls: Sequence[Mapping[str, Any]]) -> Schedule:
  """Every call in the earliest step its dependencies allow."""
  depth: list[int] = []
  for deps in dependencies(calls):
    depth.append(1 + max((depth[d] for d in deps), default=-1))
  return [[i for i, d in enumerate(depth) if d == s] for s in range(max(depth) + 1)]


def random_schedule(calls: Sequence[Mapping[str, Any]], rng: random.Random) -> Schedule:
  """A random valid schedule: each step runs a random non-empty subset of the ready calls."""
  deps = dependencies(calls)
  done: set[int] = set()
  schedule: Schedule = []
  while len(done) < len(calls):
    ready = [i for i in range(len(calls)) if i not in done and deps[i] <= done]
    step = [i for i in ready if rng.random() < 0.5] or [rng.choice(ready)]
    schedule.append(step)
    done.update(step)
  return schedule


def run_call(tools: Mapping[str, Tool], call: Mapping[str, Any]) -> dict:
  """Executes one call directly: `{"name", "result"}` or `{"name", "error"}`."""
  name = call["name"]
  tool = tools.get(name)
  if tool is None:
    return {"name": name, "error": f"unknown tool: {name}"}
  try:
    return {"name": name, "result": tool.fn(**call["arguments"])}
  except ToolError as e:
    return {"name": name, "error": str(e)}


@dataclasses.dataclass
class Execution:
  """A plan run along a schedule until the end or the first step with an error."""

  steps: list[list[dict]]  # resolved calls per executed step
  entries: list[list[dict]]  # tool-response entries per executed step
  results: dict[int, Any]  # call index -> result, for the calls that succeeded
  error: bool  # stopped at a step with an error


def execute(calls: Sequence[Mapping[str, Any]], tools: Sequence[Tool],
            schedule: Schedule) -> Execution:
  by_name = {t.name: t for t in tools}
  run = Execution([], [], {}, False)
  for step in schedule:
    resolved = [{"name": calls[i]["name"], "arguments": resolve(calls[i]["arguments"], run.results)}
                for i in step]
    entries = [run_call(by_name, c) for c in resolved]
    run.steps.append(resolved)
    run.entries.append(entries)
    for i, e in zip(step, entries):
      if "result" in e:
        run.results[i] = e["result"]
    if any("error" in e for e in entries):
      run.error = True
      break
  return run


def format_answer(result: Any) -> str:
  """The answer string of a final result: lists are joined with ", "."""
  if isinstance(result, list):
    return ", ".join(str(x) for x in result)
  return str(result)
