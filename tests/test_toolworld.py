"""toolworld: ground-truth trajectories, valid orders, down tools, tools, splits, knobs."""

import datetime
import hashlib
import json
import math
import random
import re

import hypothesis
import hypothesis.strategies as st
import jsonschema
import pytest

from tirjax.env.tools import TERMINAL_TOOL, UNABLE_TO_ANSWER, ToolError
from tirjax.env.toolworld.demos import flip as flip_direction
from tirjax.env.toolworld import demos as demos_lib
from tirjax.env.toolworld import plan as plan_lib
from tirjax.env.toolworld.queries import DIRECTION_TOOLS, KNOCKOUT_DIRECTIONS, TEMPLATES, Unfit
from tirjax.env.toolworld.tasks import Difficulty, make_tasks, split_of, task_from_metadata
from tirjax.env.toolworld.toolbox import SPECS, TOOL_NAMES, UNAVAILABLE, make_tools
from tirjax.env.toolworld.world import GAP, World, make_world

ALL_HOPS = Difficulty(hop_weights=(1, 1, 1, 1), p_parallel=0.5, p_down=0.25)


@pytest.fixture(scope="module")
def tasks():
  return (make_tasks("train", 500, seed=0, difficulty=ALL_HOPS)
          + make_tasks("eval", 150, seed=7, difficulty=ALL_HOPS)
          + make_tasks("train", 150, seed=3)
          + make_tasks("train", 60, seed=5, difficulty=Difficulty(hop_weights=(0, 0, 0, 1),
                                                                  chain_directions=2))
          + [t for k in KNOCKOUT_DIRECTIONS for t in make_tasks("train", 10, seed=6, difficulty=(
              Difficulty(chain_directions=k, chain_family="knockout")))])


def _call_tool(task, call):
  """Calls a tool directly (no plan machinery): ('result', value) or ('error', message)."""
  tool = {t.name: t for t in task.tools}[call["name"]]
  try:
    return "result", tool.fn(**call["arguments"])
  except ToolError as e:
    return "error", str(e)


def _answer_text(value):
  return ", ".join(value) if isinstance(value, list) else str(value)


def _same_answer(a: str, b: str) -> bool:
  """A rule-based verifier: normalised exact match, numbers with a relative tolerance 1e-6."""
  a, b = a.strip().lower(), b.strip().lower()
  try:
    x, y = float(a), float(b)
  except ValueError:
    return a == b
  return math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9)


def _resolve(value, results):
  """The plan's refs replaced (a plain reference of `plan.resolve`): `{"$ref": i}` by result
  i, a key `"$ref:i"` by result i as a string, `{"$pick": i, "items"}` by the items' value
  under result i."""
  if isinstance(value, dict) and set(value) == {"$ref"}:
    return results[value["$ref"]]
  if isinstance(value, dict) and set(value) == {"$pick", "items"}:
    return _resolve(value["items"], results)[str(results[value["$pick"]])]
  if isinstance(value, dict):
    return {(str(results[int(k[5:])]) if k.startswith("$ref:") else k): _resolve(v, results)
            for k, v in value.items()}
  return value


def _deps(call):
  """The calls whose results `call` needs (every form of ref, read off its JSON)."""
  found = re.findall(r'"\$ref": (\d+)|"\$ref:(\d+)"|"\$pick": (\d+)',
                     json.dumps(call["arguments"]))
  return {int("".join(m)) for m in found}


def _run_order(task, order):
  """Executes the plan's calls one at a time in `order`, arguments from earlier outputs."""
  calls, results = task.metadata["plan"], {}
  for i in order:
    assert _deps(calls[i]) <= set(results)
    kind, value = _call_tool(task, {"name": calls[i]["name"],
                                    "arguments": _resolve(calls[i]["arguments"], results)})
    if kind == "error":
      return kind, value
    results[i] = value
  return "result", results[len(calls) - 1]


def test_coverage_of_query_kinds(tasks):
  kinds = {(t.metadata["hops"], t.metadata["parallel"], t.metadata["down"] is not None)
           for t in tasks}
  for hops in (1, 2, 3, 4):
    for down in (False, True):
      assert (hops, False, down) in kinds
      if hops > 1:
        assert (hops, True, down) in kinds
  assert {t.metadata["template"] for t in tasks} == set(TEMPLATES)


def test_ground_truth_trajectories_reach_the_reference(tasks):
  validators = {name: jsonschema.Draft202012Validator(schema)
                for name, (_, schema) in SPECS.items()}
  for task in tasks:
    down = task.metadata["down"]
    plan = task.metadata["plan"]
    assert all(c["name"] != TERMINAL_TOOL for step in task.gt_calls for c in step)
    # the plan's index of each ground-truth call (a plan need not list its calls in step order)
    order = [i for step in plan_lib.canonical_schedule(plan) for i in step]
    results, outputs, position = {}, [], 0
    for step in task.gt_calls:
      assert step, task.task_id
      for j, call in enumerate(step):
        validators[call["name"]].validate(call["arguments"])
        # Arguments derive from earlier steps' tool outputs: the plan resolved with them.
        assert call == {"name": plan[order[position + j]]["name"],
                        "arguments": _resolve(plan[order[position + j]]["arguments"], results)}
      for call in step:
        kind, value = _call_tool(task, call)
        outputs.append((kind, value))
        if kind == "result":
          results[order[position]] = value
        position += 1
    errors = [(c["name"], v) for c, (k, v) in zip(task.flat_gt_calls, outputs) if k == "error"]
    if down is None:
      assert not errors and position == len(plan)
      assert task.answer == _answer_text(outputs[-1][1]) == task.metadata["answer_if_up"]
    else:
      assert task.answer == UNABLE_TO_ANSWER
      assert errors and all(e == (down, UNAVAILABLE) for e in errors)
      assert any(c["name"] == down for c in task.gt_calls[-1])  # the trajectory stops there
      assert not _same_answer(task.metadata["answer_if_up"], UNABLE_TO_ANSWER)
    # hops and parallel as declared, for the full (all tools up) canonical schedule
    schedule = plan_lib.canonical_schedule(plan)
    assert len(schedule) == task.metadata["hops"]
    assert any(len(s) > 1 for s in schedule) == task.metadata["parallel"]
    json.dumps([task.gt_calls, task.answer, task.metadata])


def _valid_orders(calls, limit=50):
  """Topological orders of the plan's dependency graph (reference: brute-force DFS)."""
  deps = [_deps(c) for c in calls]
  out = []

  def dfs(order):
    if len(out) >= limit:
      return
    if len(order) == len(calls):
      out.append(list(order))
      return
    for i in range(len(calls)):
      if i not in order and deps[i] <= set(order):
        dfs(order + [i])
  dfs([])
  return out


def test_every_valid_order_reaches_the_same_answer(tasks):
  multi = 0
  for task in tasks:
    orders = _valid_orders(task.metadata["plan"])
    multi += len(orders) > 1
    for order in orders:
      kind, value = _run_order(task, order)
      if task.metadata["down"] is None:
        assert kind == "result" and _answer_text(value) == task.answer
      else:  # every order needs the down tool: none can answer
        assert (kind, value) == ("error", UNAVAILABLE)
  assert multi > len(tasks) // 5


def test_random_schedules_are_valid_and_agree(tasks):
  rng = random.Random(0)
  for task in tasks[:200]:
    calls = task.metadata["plan"]
    for _ in range(3):
      schedule = plan_lib.random_schedule(calls, rng)
      order = [i for step in schedule for i in step]
      assert sorted(order) == list(range(len(calls)))
      assert order in _valid_orders(calls, limit=10**6)
      run = plan_lib.execute(calls, task.tools, schedule)
      if task.metadata["down"] is None:
        assert not run.error
        assert plan_lib.format_answer(run.results[len(calls) - 1]) == task.answer
      else:
        assert run.error


def test_wrong_answers_differ_from_the_reference(tasks):
  checked = 0
  for task in (t for t in tasks if t.metadata["down"] is None):
    plan, world = task.metadata["plan"], World.from_dict(task.metadata["world"])
    # An agent that stops early: no intermediate result is the answer.
    order = list(range(len(plan)))
    for k in range(len(plan) - 1):
      kind, value = _run_order_prefix(task, order[:k + 1])
      assert not _same_answer(_answer_text(value), task.answer)
    final = plan[-1]
    flips = {"compare": ("mode", {"max": "min", "min": "max"}),
             "sort_list": ("order", {"asc": "desc", "desc": "asc"}),
             "filter_list": ("op", {"gt": "lt", "lt": "gt"})}
    if final["name"] in flips:  # the opposite selection is a different answer
      key, flip = flips[final["name"]]
      wrong = {**final, "arguments": {**final["arguments"], key: flip[final["arguments"][key]]}}
      kind, value = _run_plan(task, plan[:-1] + [wrong])
      assert kind == "result" and not _same_answer(_answer_text(value), task.answer)
      checked += 1
      continue
    if TEMPLATES[task.metadata["template"]].directions > 1:  # a chain: each direction matters
      for k, call in enumerate(plan):
        if call["name"] in DIRECTION_TOOLS:
          kind, value = _run_plan(task, plan[:k] + [flip_direction(call)] + plan[k + 1:])
          assert kind == "result" and not _same_answer(_answer_text(value), task.answer), task
          checked += 1
      continue
    # A wrong entity in the first look-up changes the answer whenever that look-up changes.
    first = plan[0]
    key = {"person_info": "name", "company_info": "name", "city_info": "name",
           "distance": "city_a"}.get(first["name"])
    if key is None:
      continue
    table = {"person_info": world.people, "company_info": world.companies,
             "city_info": world.cities, "distance": world.cities}[first["name"]]
    for other in sorted(set(table) - {first["arguments"][key]}):
      if first["name"] == "distance" and other == first["arguments"]["city_b"]:
        continue
      swapped = {**first, "arguments": {**first["arguments"], key: other}}
      if _call_tool(task, swapped) == _call_tool(task, first):
        continue
      kind, value = _run_plan(task, [swapped] + plan[1:])
      assert kind == "result" and not _same_answer(_answer_text(value), task.answer), task
      checked += 1
  assert checked > len(tasks) // 2


def _run_plan(task, calls):
  patched = type(task)(task.task_id, task.question, task.tools, task.answer,
                       metadata={**task.metadata, "plan": calls})
  return _run_order(patched, list(range(len(calls))))


def _run_order_prefix(task, order):
  calls, results = task.metadata["plan"], {}
  for i in order:
    kind, value = _call_tool(task, {"name": calls[i]["name"],
                                    "arguments": _resolve(calls[i]["arguments"], results)})
    results[i] = value
  return kind, value


def test_world_values_are_distinct():
  for seed in range(200):
    w = make_world(random.Random(seed))
    names = list(w.people) + list(w.companies) + list(w.cities)
    assert len(set(names)) == len(names)
    assert len({c["hq"] for c in w.companies.values()}) == len(w.companies)
    assert len({p["born"] for p in w.people.values()}) == len(w.people)
    columns = [[c[f] for c in w.cities.values()] for f in ("population", "temp_c", "elevation_m")]
    columns += [[c[f] for c in w.companies.values()] for f in ("revenue", "staff")]
    columns.append(list(w.distances.values()))
    for col in columns:
      for i, a in enumerate(col):
        for b in col[i + 1:]:
          assert abs(a - b) >= max(1, GAP * max(abs(a), abs(b)))


def test_tools_match_independent_formulas():
  w = make_world(random.Random(5))
  tools = {t.name: t.fn for t in make_tools(w)}
  p, person = next(iter(w.people.items()))
  assert tools["person_info"](name=p, field="born") == person["born"]
  x, y = list(w.cities)[:2]
  assert tools["distance"](city_a=x, city_b=y) == tools["distance"](city_a=y, city_b=x) > 0
  for c in (-7, 0, 21, 35):
    assert abs(tools["convert"](value=c, from_unit="c", to_unit="f") - (c * 1.8 + 32)) <= 0.05
  assert abs(tools["convert"](value=100, from_unit="km", to_unit="mi") - 62.137) <= 0.05
  assert abs(tools["convert"](value=1000, from_unit="m", to_unit="ft") - 3280.84) <= 0.05
  assert abs(tools["convert"](value=10, from_unit="lb", to_unit="kg") - 4.536) <= 0.05
  assert tools["calculate"](op="div", a=7, b=2) == 3.5
  assert tools["calculate"](op="mul", a=2.5, b=4) == 10 and isinstance(
      tools["calculate"](op="mul", a=2.5, b=4), int)
  d0, d1 = datetime.date(2021, 3, 1), datetime.date(2024, 2, 29)
  assert tools["date_diff"](start=str(d0), end=str(d1)) == d1.toordinal() - d0.toordinal()
  items = {"A": 3, "B": 9, "C": 1}
  assert tools["compare"](items=items, mode="max") == "B"
  assert tools["compare"](items=items, mode="min") == "C"
  assert tools["sort_list"](items=items, order="desc") == ["B", "A", "C"]
  assert tools["filter_list"](items=items, op="gt", value=2) == ["A", "B"]
  assert tools["filter_list"](items=items, op="lt", value=2) == ["C"]


@pytest.mark.parametrize("name,arguments,message", [
    ("person_info", {"name": "Nobody", "field": "city"}, "unknown person: Nobody"),
    ("person_info", {"name": "$P", "field": "age"}, "field must be one of city, company, born"),
    ("person_info", {"name": 3, "field": "city"}, "name must be a non-empty string"),
    ("person_info", {"name": "$P"}, "missing arguments ['field']"),
    ("company_info", {"name": "$P", "field": "hq"}, "unknown company"),
    ("city_info", {"name": "$X", "field": "hq"}, "field must be one of"),
    ("distance", {"city_a": "$X", "city_b": "Atlantis"}, "unknown city: Atlantis"),
    ("calculate", {"op": "div", "a": 1, "b": 0}, "division by zero"),
    ("calculate", {"op": "pow", "a": 1, "b": 2}, "op must be one of add, sub, mul, div"),
    ("calculate", {"op": "add", "a": "1", "b": 2}, "a must be a number"),
    ("calculate", {"op": "add", "a": True, "b": 2}, "a must be a number"),
    ("calculate", {"op": "add", "a": 1, "b": 2, "c": 3}, "unexpected arguments ['c']"),
    ("calculate", {"op": "mul", "a": 1e308, "b": 10}, "the result is out of range"),
    ("convert", {"value": 1e308, "from_unit": "kg", "to_unit": "lb"}, "out of range"),
    ("convert", {"value": 1, "from_unit": "km", "to_unit": "f"}, "cannot convert km to f"),
    ("convert", {"value": 1, "from_unit": "yd", "to_unit": "m"}, "from_unit must be one of"),
    ("compare", {"items": {"A": 1}, "mode": "max"}, "at least 2 labels"),
    ("compare", {"items": {"A": 1, "B": "x"}, "mode": "max"}, "items['B'] must be a number"),
    ("sort_list", {"items": {"A": 1, "B": 2}, "order": "up"}, "order must be one of asc, desc"),
    ("filter_list", {"items": [1, 2], "op": "gt", "value": 1}, "items must be an object"),
    ("date_diff", {"start": "01/02/2020", "end": "2020-03-01"}, "start must be a date YYYY-MM-DD"),
])
def test_tool_errors_are_explicit(name, arguments, message):
  w = make_world(random.Random(11))
  person, city = next(iter(w.people)), next(iter(w.cities))
  arguments = {k: {"$P": person, "$X": city}.get(v, v) if isinstance(v, str) else v
               for k, v in arguments.items()}
  tool = {t.name: t for t in make_tools(w)}[name]
  with pytest.raises(ToolError) as e:
    tool.fn(**arguments)
  assert message in str(e.value)


def test_down_tool_and_schemas():
  w = make_world(random.Random(2))
  for name in TOOL_NAMES:
    tools = {t.name: t for t in make_tools(w, down=name)}
    with pytest.raises(ToolError, match=UNAVAILABLE):
      tools[name].fn()
    jsonschema.Draft202012Validator.check_schema(tools[name].parameters)
    assert tools[name].spec()["function"]["name"] == name
  assert len(TOOL_NAMES) >= 8 and make_tools(w)[-1].name == TERMINAL_TOOL
  with pytest.raises(ValueError, match="down"):
    make_tools(w, down="weather")


def test_splits_are_deterministic_and_disjoint():
  def key(ts):
    return [(t.task_id, t.question, t.answer, json.dumps(t.gt_calls)) for t in ts]
  train, again = make_tasks("train", 300, seed=4), make_tasks("train", 300, seed=4)
  evals = make_tasks("eval", 100, seed=4)
  assert key(train) == key(again)
  assert key(evals) == key(make_tasks("eval", 100, seed=4))
  assert key(make_tasks("train", 50, seed=4)) == key(train[:50])  # a prefix of the stream
  assert not {t.question for t in train} & {t.question for t in evals}
  assert not {t.task_id for t in train} & {t.task_id for t in evals}
  assert all(split_of(t.question) == "train" for t in train)
  assert all(split_of(t.question) == "eval" for t in evals)
  assert len({t.task_id for t in train}) == 300
  other = make_tasks("train", 300, seed=5)
  assert len({t.question for t in train} & {t.question for t in other}) < 30


def test_difficulty_knobs():
  one = make_tasks("train", 60, difficulty=Difficulty(hop_weights=(1, 0, 0, 0), p_down=0))
  assert all(t.metadata["hops"] == 1 and t.metadata["down"] is None for t in one)
  par = make_tasks("train", 60, difficulty=Difficulty(hop_weights=(0, 1, 1, 1), p_parallel=1))
  assert all(t.metadata["parallel"] for t in par)
  seq = make_tasks("train", 60, difficulty=Difficulty(hop_weights=(0, 0, 0, 1), p_parallel=0))
  assert all(t.metadata["hops"] == 4 and not t.metadata["parallel"] for t in seq)
  down = make_tasks("train", 60, difficulty=Difficulty(p_down=1))
  assert all(t.answer == UNABLE_TO_ANSWER for t in down)
  for bad, match in [(dict(hop_weights=(1, 1)), "hop_weights"),
                     (dict(hop_weights=(0, 0, 0, 0)), "hop_weights"),
                     (dict(hop_weights=(1, -1, 1, 1)), "hop_weights"),
                     (dict(p_parallel=1.5), "p_parallel"), (dict(p_down=-0.1), "p_down")]:
    with pytest.raises(ValueError, match=match):
      Difficulty(**bad)
  with pytest.raises(ValueError, match="split"):
    make_tasks("test", 1)
  with pytest.raises(ValueError, match="p_direction"):
    Difficulty(p_direction=2)


def test_direction_templates_are_those_whose_plan_takes_a_direction():
  """`Template.direction` says what the plans hold, for every template; every hop count and
  parallel kind has one, so `p_direction` = 1 keeps the hop mix."""
  rng = random.Random(0)
  for t in TEMPLATES.values():
    built = 0
    while built < 5:
      try:
        _, calls = t.build(rng, make_world(rng, t.cities))
      except Unfit:  # this world cannot host it
        continue
      built += 1
      assert t.direction == any(c["name"] in DIRECTION_TOOLS for c in calls), t.name
  kinds = {(t.hops, t.parallel) for t in TEMPLATES.values()}
  assert kinds == {(t.hops, t.parallel) for t in TEMPLATES.values() if t.direction}


def test_p_direction_draws_queries_that_hinge_on_a_direction():
  every = make_tasks("train", 200, seed=0, difficulty=Difficulty(p_direction=1.0))
  assert all(TEMPLATES[t.metadata["template"]].direction for t in every)
  assert {t.metadata["hops"] for t in every} == {1, 2, 3, 4}
  half = make_tasks("train", 400, seed=0, difficulty=Difficulty(p_direction=0.5))
  share = sum(TEMPLATES[t.metadata["template"]].direction for t in half) / 400
  base = sum(TEMPLATES[t.metadata["template"]].direction for t in make_tasks("train", 400)) / 400
  assert base < share < 1
  # p_direction = 0 draws the streams of before the knob (fingerprints taken at e4ecef7).
  for split, want in (("train", "59c8cb21493d13f3"), ("eval", "590f42a0cc96159f")):
    text = "\n".join(f"{t.question}|{t.answer}" for t in make_tasks(split, 300, seed=0))
    assert hashlib.sha256(text.encode()).hexdigest()[:16] == want


def test_chain_templates_take_each_direction_in_a_step_of_its_own():
  """`Template.directions` counts the plan's direction calls; a chain's are in different steps
  (so that a turn-level estimator can tell them apart), and `chain_directions` draws only
  chains, which no other setting draws."""
  chains = [t for t in TEMPLATES.values() if t.directions > 1 and not t.family]
  assert chains
  rng = random.Random(0)
  for t in TEMPLATES.values():
    for _ in range(5):
      while True:
        try:
          _, calls = t.build(rng, make_world(rng, t.cities))
          break
        except Unfit:
          continue
      assert t.directions == sum(c["name"] in DIRECTION_TOOLS for c in calls), t.name
  difficulty = Difficulty(hop_weights=(0, 0, 0, 1), chain_directions=2, p_down=0.0)
  drawn = make_tasks("train", 60, seed=0, difficulty=difficulty)
  assert {t.metadata["template"] for t in drawn} == {t.name for t in chains}
  for task in drawn:
    steps = [s for s, step in enumerate(task.gt_calls) for c in step
             if c["name"] in DIRECTION_TOOLS]
    assert len(steps) == len(set(steps)) == 2, task.question
  others = make_tasks("train", 400, seed=0, difficulty=Difficulty(p_direction=1.0))
  assert not {t.metadata["template"] for t in others} & {
      t.name for t in TEMPLATES.values() if t.directions > 1}
  # The first chains' streams are those of before the knockout family (taken at 6eccc85).
  for split, want in (("train", "fb418651a1afe5af"), ("eval", "41b59bb75da236d9")):
    text = "\n".join(f"{t.question}|{t.answer}" for t in make_tasks(split, 200, seed=0,
                                                                     difficulty=difficulty))
    assert hashlib.sha256(text.encode()).hexdigest()[:16] == want
  with pytest.raises(ValueError, match="chain_directions=2.*hops"):
    Difficulty(chain_directions=2)  # the default hop mix weighs hops no chain has
  with pytest.raises(ValueError, match="chain_directions=3"):
    Difficulty(hop_weights=(0, 0, 0, 1), chain_directions=3)


def _knockout(k, n=40, seed=0, split="train"):
  return make_tasks(split, n, seed=seed, difficulty=Difficulty(
      chain_directions=k, chain_family="knockout", p_down=0.0))


def _won(steps, entries):
  """Each compare's winning value along a run: its items' value under the label it returned."""
  return [c["arguments"]["items"][e["result"]] for step, out in zip(steps, entries)
          for c, e in zip(step, out) if c["name"] == "compare"]


@pytest.mark.parametrize("k", KNOCKOUT_DIRECTIONS)
def test_knockout_chains_take_k_directions_each_of_which_decides(k):
  """The knockout family at K directions: 2K + 1 steps of 4K - 1 calls, each compare alone in
  its step after the look-up of the city that the compare before named; the answer is the sum
  of the compares' winning values; and each single wrong direction, carried down its branch
  (later look-ups, items keyed by what that branch returned, the sum of its own winning
  values), gives another answer."""
  drawn = _knockout(k)
  assert {t.metadata["template"] for t in drawn} == {f"knockout_cities_{k}"}
  for task in drawn:
    plan, cities = task.metadata["plan"], set(task.metadata["world"]["cities"])
    assert len(task.gt_calls) == 2 * k + 1 and len(task.flat_gt_calls) == 4 * k - 1
    steps = [s for s, step in enumerate(task.gt_calls) for c in step if c["name"] == "compare"]
    assert steps == list(range(1, 2 * k, 2)), task.question
    assert all(len(task.gt_calls[s]) == 1 for s in steps)
    schedule = plan_lib.canonical_schedule(plan)
    right = plan_lib.execute(plan, task.tools, schedule)
    assert task.answer == str(sum(_won(right.steps, right.entries)))
    for i, call in enumerate(plan):
      if call["name"] != "compare":
        continue
      run = plan_lib.execute(plan[:i] + [flip_direction(call)] + plan[i + 1:], task.tools,
                             schedule)
      answer = plan_lib.format_answer(run.results[len(plan) - 1])
      assert not run.error and answer != task.answer, (task.question, i)
      assert answer == str(sum(_won(run.steps, run.entries)))  # its own branch's sum
      for c in (c for step in run.steps for c in step if c["name"] == "compare"):
        assert set(c["arguments"]["items"]) <= cities  # keyed by its branch's cities


def test_knockout_family_is_its_own_draw():
  """`chain_family` draws only its own templates at its K, and is checked: an unknown family,
  or a K the family lacks, is a clear error; its questions split like every other's."""
  with pytest.raises(ValueError, match="chain_family: must be one of"):
    Difficulty(chain_directions=2, chain_family="tournament")
  with pytest.raises(ValueError, match="chain_family='knockout' needs chain_directions"):
    Difficulty(chain_directions=5, chain_family="knockout")
  with pytest.raises(ValueError, match="chain_family='knockout' needs chain_directions"):
    Difficulty(chain_family="knockout")
  train, evals = _knockout(4, 30), _knockout(4, 10, split="eval")
  assert not {t.question for t in train} & {t.question for t in evals}
  assert {t.metadata["down"] for t in train + evals} == {None}
  assert ([(t.question, t.answer) for t in _knockout(2, 30, seed=1)]
          == [(t.question, t.answer) for t in _knockout(2, 30, seed=1)])


def test_key_refs_resolve_to_the_earlier_result_as_a_string():
  """A key `"$ref:i"` of an object is result i (as a string) and a dependency on call i."""
  calls = [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}},
           {"name": "c", "arguments": {"items": {plan_lib.key_ref(0): plan_lib.ref(1), "x": 2}}}]
  assert plan_lib.dependencies(calls) == [set(), set(), {0, 1}]
  assert plan_lib.canonical_schedule(calls) == [[0, 1], [2]]
  assert plan_lib.resolve(calls[2]["arguments"], {0: "Mira", 1: 7}) == {"items": {"Mira": 7,
                                                                                  "x": 2}}
  assert plan_lib.resolve({"$ref:x": 1}, {}) == {"$ref:x": 1}  # not an index: a plain key


def test_pick_refs_resolve_to_the_value_the_winner_had():
  """`pick_ref(i, items)` is the resolved items' value under result i (as a string), and a
  dependency on call i and on every ref of the items; a label the items lack is named."""
  items = {"Mira": plan_lib.ref(0), plan_lib.key_ref(1): plan_lib.ref(2)}
  calls = [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}},
           {"name": "c", "arguments": {}}, {"name": "d", "arguments": {}},
           {"name": "e", "arguments": {"a": plan_lib.pick_ref(3, items), "b": 1}}]
  assert plan_lib.dependencies(calls)[4] == {0, 1, 2, 3}
  assert plan_lib.canonical_schedule(calls) == [[0, 1, 2, 3], [4]]
  for winner, want in (("Mira", 5), ("Tosk", 9)):
    results = {0: 5, 1: "Tosk", 2: 9, 3: winner}
    assert plan_lib.resolve(calls[4]["arguments"], results) == {"a": want, "b": 1}
  with pytest.raises(KeyError, match="no item 'Lund'"):
    plan_lib.resolve(calls[4]["arguments"], {0: 5, 1: "Tosk", 2: 9, 3: "Lund"})


def test_knockout_demos_follow_the_branch_they_took():
  """A confused demonstration (each direction random) keys each compare's items by the city
  that its previous compare returned, so that SFT never shows a key from nowhere, and answers
  the sum of its own branch's winning values."""
  rng, wrong = random.Random(0), 0
  for task in _knockout(4, 20):
    demo = demos_lib.make_demo(task, rng, demos_lib.DemoOptions(p_confuse=1.0))
    holder, won = None, 0
    for m, reply in zip(demo.messages, demo.messages[1:]):
      calls = re.search(r"<tool_call>(.*)</tool_call>", m["content"])
      if m["role"] != "assistant" or not calls:
        continue
      for call, entry in zip(json.loads(calls.group(1)), json.loads(reply["content"])):
        if call["name"] == "compare":
          if holder is not None:
            assert holder in call["arguments"]["items"], task.question
          holder = entry["result"]
          won += call["arguments"]["items"][holder]
    assert demo.answer == str(won)
    wrong += demo.answer != task.answer
  assert wrong > 0  # some branches were taken


def test_task_rebuilds_from_json_metadata(tasks):
  for task in tasks[:100]:
    meta = json.loads(json.dumps(task.metadata))
    again = task_from_metadata(task.task_id, task.question, meta)
    assert again.answer == task.answer and again.gt_calls == task.gt_calls


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=True)
    | st.text(max_size=12) | st.sampled_from(["Mira", "km", "f", "max", "2020-01-01", "city"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                               max_size=3),
    max_leaves=8)


def _call_strategy(name):
  keys = list(SPECS[name][1]["properties"])
  full = st.fixed_dictionaries({k: _JSON for k in keys})
  ragged = st.dictionaries(st.sampled_from(keys + ["x"]), _JSON, max_size=len(keys) + 1)
  return st.tuples(st.just(name), full | ragged)


@hypothesis.given(st.sampled_from(TOOL_NAMES).flatmap(_call_strategy))
def test_tools_only_ever_raise_tool_errors(call):
  name, arguments = call
  tool = {t.name: t for t in make_tools(make_world(random.Random(1)))}[name]
  try:
    json.dumps(tool.fn(**arguments), allow_nan=False)
  except ToolError as e:
    assert str(e)
