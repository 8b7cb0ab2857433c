"""Query templates: a question and its plan (calls with `{"$ref": i}` arguments) over a world.

Each template is registered with its number of hops (steps of its canonical schedule) and
whether a step of it holds parallel calls. A template raises `Unfit` when the world cannot host
it (e.g. two people who must live in different cities do not); the caller draws a new world.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import random
from typing import Any, Callable, Optional

from tirjax.env.toolworld.plan import canonical_schedule, execute, key_ref, pick_ref, ref
from tirjax.env.toolworld.toolbox import make_tools
from tirjax.env.toolworld.world import CITY_FIELDS, N_CITIES, World, random_date

Built = tuple[str, list[dict]]


class Unfit(Exception):
  """The world cannot host this query."""


# Tools whose call takes a direction the question states: compare's max/min, sort_list's
# order, filter_list's over/under, convert's from/to (see `demos.confuse`).
DIRECTION_TOOLS = ("compare", "sort_list", "filter_list", "convert")
# Their parameters that hold the direction: the strict similarity's
# (`matching.similarity.strict_call_similarity`) mask.
DIRECTION_PARAMS = {"compare": ("mode",), "sort_list": ("order",), "filter_list": ("op",),
                    "convert": ("from_unit", "to_unit")}


@dataclasses.dataclass(frozen=True)
class Template:
  name: str
  hops: int
  parallel: bool
  build: Callable[[random.Random, World], Built]
  direction: bool = False  # its plan has a call of a `DIRECTION_TOOLS` tool
  # Calls of `DIRECTION_TOOLS` in its plan, each in a step of its own: 2 or more for the chain
  # templates of the credit testbed (`Difficulty.chain_directions`), drawn only there.
  directions: int = 0
  # The chain family it belongs to (`Difficulty.chain_family`): "" for the first chains, or
  # "knockout" (`knockout_cities`: one query family at every number of directions).
  family: str = ""
  cities: int = N_CITIES  # cities of the world it is drawn in (`world.make_world`)


TEMPLATES: dict[str, Template] = {}


def _template(hops: int, parallel: bool, direction: bool = False, directions: int = 0,
              family: str = "", name: str = "", cities: int = N_CITIES):
  def register(fn):
    key = name or fn.__name__
    TEMPLATES[key] = Template(key, hops, parallel, fn, direction or directions > 0,
                              directions or int(direction), family, cities)
    return fn
  return register


CITY_NOUN = {"population": "the population", "temp_c": "the temperature",
             "elevation_m": "the elevation"}
CITY_MORE = {"population": ("larger", "smaller"), "temp_c": ("warmer", "colder"),
             "elevation_m": ("higher", "lower")}
COMPANY_MORE = {"revenue": ("higher revenue", "lower revenue"),
                "staff": ("more staff", "fewer staff")}
CITY_CONVERSION = {"temp_c": ("the temperature", "c", "f", "Fahrenheit"),
                   "elevation_m": ("the elevation", "m", "ft", "feet")}
UNIT_WORDS = {"c": "Celsius", "f": "Fahrenheit", "km": "km", "mi": "miles", "m": "meters",
              "ft": "feet", "kg": "kg", "lb": "pounds"}
CONVERSIONS = (("c", "f"), ("f", "c"), ("km", "mi"), ("mi", "km"), ("m", "ft"), ("ft", "m"),
               ("kg", "lb"), ("lb", "kg"))
QUESTION_DATES = (datetime.date(2020, 1, 1), datetime.date(2029, 12, 31))


def _look(tool: str, name, field: str) -> dict:
  return {"name": tool, "arguments": {"name": name, "field": field}}


def _person(name, field):
  return _look("person_info", name, field)


def _company(name, field):
  return _look("company_info", name, field)


def _city(name, field):
  return _look("city_info", name, field)


def _call(name: str, **arguments) -> dict:
  return {"name": name, "arguments": arguments}


def _convert(value, from_unit, to_unit):
  return _call("convert", value=value, from_unit=from_unit, to_unit=to_unit)


def _pick(rng: random.Random, seq, k: int = 1) -> list:
  seq = sorted(seq)
  if len(seq) < k:
    raise Unfit
  return rng.sample(seq, k)


def _pair_where(rng: random.Random, world: World, key) -> tuple[str, str]:
  """Two people whose `key(person)` differ."""
  pairs = [(a, b) for a in world.people for b in world.people
           if a != b and key(a) != key(b)]
  return tuple(_pick(rng, pairs)[0])


def _mode(rng: random.Random, words: tuple[str, str]) -> tuple[str, str]:
  mode = rng.choice(("max", "min"))
  return mode, words[mode == "min"]


# --- 1 hop -----------------------------------------------------------------------------------

@_template(1, False)
def person_attr(rng, world):
  (p,), field = _pick(rng, world.people), rng.choice(("city", "company", "born"))
  question = {"city": f"Where does {p} live?", "company": f"Which company does {p} work for?",
              "born": f"When was {p} born?"}[field]
  return question, [_person(p, field)]


@_template(1, False)
def company_attr(rng, world):
  (c,), field = _pick(rng, world.companies), rng.choice(("hq", "revenue", "staff"))
  question = {"hq": f"Where is {c} based?", "revenue": f"What is the revenue of {c}?",
              "staff": f"How many staff does {c} have?"}[field]
  return question, [_company(c, field)]


@_template(1, False)
def city_attr(rng, world):
  (x,), field = _pick(rng, world.cities), rng.choice(CITY_FIELDS)
  return f"What is {CITY_NOUN[field]} of {x}?", [_city(x, field)]


@_template(1, False)
def city_distance(rng, world):
  a, b = _pick(rng, world.cities, 2)
  return f"How far is {a} from {b}?", [_call("distance", city_a=a, city_b=b)]


@_template(1, False)
def arithmetic(rng, world):
  op = rng.choice(("add", "sub", "mul", "div"))
  a, b = rng.randint(2, 99), rng.randint(2, 99)
  word = {"add": "plus", "sub": "minus", "mul": "times", "div": "divided by"}[op]
  return f"What is {a} {word} {b}?", [_call("calculate", op=op, a=a, b=b)]


@_template(1, False, direction=True)
def unit_conversion(rng, world):
  from_unit, to_unit = rng.choice(CONVERSIONS)
  value = rng.randint(-10, 40) if from_unit == "c" else rng.randint(1, 999)
  question = f"What is {value} {UNIT_WORDS[from_unit]} in {UNIT_WORDS[to_unit]}?"
  return question, [_convert(value, from_unit, to_unit)]


@_template(1, False)
def days_between(rng, world):
  start = random_date(rng, *QUESTION_DATES)
  end = start + datetime.timedelta(days=rng.randint(1, 2000))
  return (f"How many days are there from {start} to {end}?",
          [_call("date_diff", start=start.isoformat(), end=end.isoformat())])


# --- 2 hops ----------------------------------------------------------------------------------

@_template(2, False)
def person_city_attr(rng, world):
  (p,), field = _pick(rng, world.people), rng.choice(CITY_FIELDS)
  return (f"What is {CITY_NOUN[field]} of the city where {p} lives?",
          [_person(p, "city"), _city(ref(0), field)])


@_template(2, False)
def person_company_attr(rng, world):
  (p,), field = _pick(rng, world.people), rng.choice(("hq", "revenue", "staff"))
  question = {"hq": f"Where is {p}'s company based?",
              "revenue": f"What is the revenue of {p}'s company?",
              "staff": f"How many staff does {p}'s company have?"}[field]
  return question, [_person(p, "company"), _company(ref(0), field)]


@_template(2, False)
def company_city_attr(rng, world):
  (c,), field = _pick(rng, world.companies), rng.choice(CITY_FIELDS)
  return (f"What is {CITY_NOUN[field]} of the city where {c} is based?",
          [_company(c, "hq"), _city(ref(0), field)])


@_template(2, False, direction=True)
def city_attr_converted(rng, world):
  (x,), field = _pick(rng, world.cities), rng.choice(sorted(CITY_CONVERSION))
  noun, from_unit, to_unit, word = CITY_CONVERSION[field]
  return (f"What is {noun} of {x} in {word}?",
          [_city(x, field), _convert(ref(0), from_unit, to_unit)])


@_template(2, False, direction=True)
def city_distance_miles(rng, world):
  a, b = _pick(rng, world.cities, 2)
  return (f"How far is {a} from {b} in miles?",
          [_call("distance", city_a=a, city_b=b), _convert(ref(0), "km", "mi")])


@_template(2, False)
def age_in_days(rng, world):
  (p,), day = _pick(rng, world.people), random_date(rng, *QUESTION_DATES)
  return (f"How many days old was {p} on {day}?",
          [_person(p, "born"), _call("date_diff", start=ref(0), end=day.isoformat())])


@_template(2, False)
def person_distance(rng, world):
  (p,) = _pick(rng, world.people)
  (x,) = _pick(rng, set(world.cities) - {world.people[p]["city"]})
  return (f"How far does {p} live from {x}?",
          [_person(p, "city"), _call("distance", city_a=ref(0), city_b=x)])


@_template(2, True, direction=True)
def compare_companies(rng, world):
  c1, c2 = _pick(rng, world.companies, 2)
  field = rng.choice(sorted(COMPANY_MORE))
  mode, word = _mode(rng, COMPANY_MORE[field])
  return (f"Which company has {word}, {c1} or {c2}?",
          [_company(c1, field), _company(c2, field),
           _call("compare", items={c1: ref(0), c2: ref(1)}, mode=mode)])


@_template(2, True, direction=True)
def compare_cities(rng, world):
  x1, x2 = _pick(rng, world.cities, 2)
  field = rng.choice(CITY_FIELDS)
  mode, word = _mode(rng, CITY_MORE[field])
  return (f"Which city is {word}, {x1} or {x2}?",
          [_city(x1, field), _city(x2, field),
           _call("compare", items={x1: ref(0), x2: ref(1)}, mode=mode)])


@_template(2, True)
def company_arithmetic(rng, world):
  field = rng.choice(("revenue", "staff"))
  c1, c2 = sorted(_pick(rng, world.companies, 2), key=lambda c: -world.companies[c][field])
  op = rng.choice(("add", "sub"))
  question = (f"What is the combined {field} of {c1} and {c2}?" if op == "add" else
              f"How much more {field} does {c1} have than {c2}?")
  return question, [_company(c1, field), _company(c2, field),
                    _call("calculate", op=op, a=ref(0), b=ref(1))]


@_template(2, True)
def birth_gap(rng, world):
  p1, p2 = sorted(_pick(rng, world.people, 2), key=lambda p: world.people[p]["born"])
  return (f"How many days older is {p1} than {p2}?",
          [_person(p1, "born"), _person(p2, "born"),
           _call("date_diff", start=ref(0), end=ref(1))])


@_template(2, True, direction=True)
def sort_companies(rng, world):
  companies = _pick(rng, world.companies, 3)
  field, order = rng.choice(("revenue", "staff")), rng.choice(("desc", "asc"))
  first = {"desc": "highest", "asc": "lowest"}[order]
  return (f"Sort {companies[0]}, {companies[1]} and {companies[2]} by {field}, {first} first.",
          [_company(c, field) for c in companies]
          + [_call("sort_list", items={c: ref(i) for i, c in enumerate(companies)}, order=order)])


@_template(2, True, direction=True)
def filter_cities(rng, world):
  cities = _pick(rng, world.cities, 3)
  field, op = rng.choice(CITY_FIELDS), rng.choice(("gt", "lt"))
  values = sorted(world.cities[x][field] for x in cities)
  k = rng.choice((1, 2))  # one or two of the three pass
  lo, hi = values[k - 1], values[k]
  threshold = (lo + hi) // 2 if op == "gt" else (lo + hi + 1) // 2
  phrase = {"population": ("have a population over {}", "have a population under {}"),
            "temp_c": ("are warmer than {} C", "are colder than {} C"),
            "elevation_m": ("are higher than {} m", "are lower than {} m")}[field][op == "lt"]
  return (f"Which of {cities[0]}, {cities[1]} and {cities[2]} {phrase.format(threshold)}?",
          [_city(x, field) for x in cities]
          + [_call("filter_list", items={x: ref(i) for i, x in enumerate(cities)}, op=op,
                   value=threshold)])


# --- 3 hops ----------------------------------------------------------------------------------

@_template(3, False)
def person_company_city_attr(rng, world):
  (p,), field = _pick(rng, world.people), rng.choice(CITY_FIELDS)
  return (f"What is {CITY_NOUN[field]} of the city where {p}'s company is based?",
          [_person(p, "company"), _company(ref(0), "hq"), _city(ref(1), field)])


@_template(3, False, direction=True)
def person_city_converted(rng, world):
  (p,), field = _pick(rng, world.people), rng.choice(sorted(CITY_CONVERSION))
  noun, from_unit, to_unit, word = CITY_CONVERSION[field]
  return (f"What is {noun} of the city where {p} lives in {word}?",
          [_person(p, "city"), _city(ref(0), field), _convert(ref(1), from_unit, to_unit)])


@_template(3, False, direction=True)
def company_distance_miles(rng, world):
  (c,) = _pick(rng, world.companies)
  (x,) = _pick(rng, set(world.cities) - {world.companies[c]["hq"]})
  return (f"How far is the city where {c} is based from {x} in miles?",
          [_company(c, "hq"), _call("distance", city_a=ref(0), city_b=x),
           _convert(ref(1), "km", "mi")])


@_template(3, True, direction=True)
def people_compare_cities(rng, world):
  p1, p2 = _pair_where(rng, world, lambda p: world.people[p]["city"])
  field = rng.choice(CITY_FIELDS)
  mode, word = _mode(rng, CITY_MORE[field])
  return (f"Who lives in the {word} city, {p1} or {p2}?",
          [_person(p1, "city"), _person(p2, "city"), _city(ref(0), field), _city(ref(1), field),
           _call("compare", items={p1: ref(2), p2: ref(3)}, mode=mode)])


@_template(3, True)
def people_company_arithmetic(rng, world):
  field = rng.choice(("revenue", "staff"))

  def value(p):
    return world.companies[world.people[p]["company"]][field]

  p1, p2 = sorted(_pair_where(rng, world, value), key=lambda p: -value(p))
  op = rng.choice(("add", "sub"))
  question = (f"What is the combined {field} of the companies of {p1} and {p2}?" if op == "add"
              else f"How much more {field} does {p1}'s company have than {p2}'s?")
  return question, [_person(p1, "company"), _person(p2, "company"), _company(ref(0), field),
                    _company(ref(1), field), _call("calculate", op=op, a=ref(2), b=ref(3))]


@_template(3, True, direction=True)
def people_distance_miles(rng, world):
  p1, p2 = _pair_where(rng, world, lambda p: world.people[p]["city"])
  return (f"How many miles apart do {p1} and {p2} live?",
          [_person(p1, "city"), _person(p2, "city"),
           _call("distance", city_a=ref(0), city_b=ref(1)), _convert(ref(2), "km", "mi")])


# --- 4 hops ----------------------------------------------------------------------------------

@_template(4, False, direction=True)
def person_company_city_converted(rng, world):
  (p,), field = _pick(rng, world.people), rng.choice(sorted(CITY_CONVERSION))
  noun, from_unit, to_unit, word = CITY_CONVERSION[field]
  return (f"What is {noun} of the city where {p}'s company is based in {word}?",
          [_person(p, "company"), _company(ref(0), "hq"), _city(ref(1), field),
           _convert(ref(2), from_unit, to_unit)])


@_template(4, False, direction=True)
def person_company_distance_miles(rng, world):
  (p,) = _pick(rng, world.people)
  hq = world.companies[world.people[p]["company"]]["hq"]
  (x,) = _pick(rng, set(world.cities) - {hq})
  return (f"How far is the city where {p}'s company is based from {x} in miles?",
          [_person(p, "company"), _company(ref(0), "hq"),
           _call("distance", city_a=ref(1), city_b=x), _convert(ref(2), "km", "mi")])


@_template(4, True, direction=True)
def people_compare_company_cities(rng, world):
  p1, p2 = _pair_where(rng, world, lambda p: world.people[p]["company"])
  field = rng.choice(CITY_FIELDS)
  mode, word = _mode(rng, CITY_MORE[field])
  return (f"Whose company is based in the {word} city, {p1} or {p2}?",
          [_person(p1, "company"), _person(p2, "company"), _company(ref(0), "hq"),
           _company(ref(1), "hq"), _city(ref(2), field), _city(ref(3), field),
           _call("compare", items={p1: ref(4), p2: ref(5)}, mode=mode)])


@_template(4, True, direction=True)
def people_elevation_gap_feet(rng, world):
  def elevation(p):
    return world.cities[world.people[p]["city"]]["elevation_m"]

  p1, p2 = sorted(_pair_where(rng, world, elevation), key=lambda p: -elevation(p))
  return (f"How much higher does {p1} live than {p2} in feet?",
          [_person(p1, "city"), _person(p2, "city"), _city(ref(0), "elevation_m"),
           _city(ref(1), "elevation_m"), _call("calculate", op="sub", a=ref(2), b=ref(3)),
           _convert(ref(4), "m", "ft")])


# --- Chains of directions (the credit testbed, `Difficulty.chain_directions`) -----------------
# Two direction-taking calls in different steps, with lookups between them: a direction chosen
# wrong at one step sends the later steps down another branch, and the outcome says only that
# something went wrong. Drawn only when `chain_directions` asks for them.

@_template(4, True, directions=2)
def compare_cities_converted(rng, world):
  x1, x2 = _pick(rng, world.cities, 2)
  field = rng.choice(CITY_FIELDS)
  mode, word = _mode(rng, CITY_MORE[field])
  target = rng.choice(sorted(CITY_CONVERSION))
  noun, from_unit, to_unit, unit_word = CITY_CONVERSION[target]
  return (f"What is {noun} in {unit_word} of the {word} city, {x1} or {x2}?",
          [_city(x1, field), _city(x2, field),
           _call("compare", items={x1: ref(0), x2: ref(1)}, mode=mode),
           _city(ref(2), target), _convert(ref(3), from_unit, to_unit)])


@_template(4, True, directions=2)
def nearer_city_converted(rng, world):
  a, b, c = _pick(rng, world.cities, 3)
  mode, word = _mode(rng, ("farther from", "nearer to"))
  target = rng.choice(sorted(CITY_CONVERSION))
  noun, from_unit, to_unit, unit_word = CITY_CONVERSION[target]
  # compare(max) picks the farther city: "farther" is max, "nearer" min
  return (f"What is {noun} in {unit_word} of whichever of {b} and {c} is {word} {a}?",
          [_call("distance", city_a=a, city_b=b), _call("distance", city_a=a, city_b=c),
           _call("compare", items={b: ref(0), c: ref(1)}, mode=mode),
           _city(ref(2), target), _convert(ref(3), from_unit, to_unit)])


@_template(4, True, directions=2)
def compare_cities_distance_miles(rng, world):
  a, x1, x2 = _pick(rng, world.cities, 3)
  field = rng.choice(CITY_FIELDS)
  mode, word = _mode(rng, CITY_MORE[field])
  return (f"How far in miles is {a} from the {word} city, {x1} or {x2}?",
          [_city(x1, field), _city(x2, field),
           _call("compare", items={x1: ref(0), x2: ref(1)}, mode=mode),
           _call("distance", city_a=a, city_b=ref(2)), _convert(ref(3), "km", "mi")])


# --- Knockout chains (`Difficulty.chain_family="knockout"`) ----------------------------------
# One query family at any number K of directions, so that a testbed at K = 2 and at K = 4 differ
# in K only: K meetings, each of the city that holds the title against a challenger (two first
# cities at the first meeting, then a fresh challenger each, in a world of `KNOCKOUT_CITIES` at
# every K) on a field, the question saying which way each goes (the larger, the colder, ...).
# Each meeting is a step of look-ups (the holder's and the challenger's value) then a `compare`
# of its own, so the K direction calls are in K different steps; a wrong direction makes the
# loser the holder, and every later look-up goes down another branch.
# The answer is the sum of the winning values (each meeting's winner's value on its field),
# accumulated by `calculate` (add): the first add sums the first two meetings' winning values
# at the step after the second compare, each later one adds the next meeting's to the running
# total, so that a plan has 2K + 1 steps and 4K - 1 calls. Why a sum and not the city left at
# the end: the 2^K direction patterns leave only K + 1 possible cities, so a direction-blind
# policy was right far more often than 2^-K, and the first compare's winner was often the
# final city, so the outcome paid for answering before the later decisions. A world is kept
# (`knockout_flaw`) only when the 2^K patterns (each compare's mode right or flipped, every
# other call made right on the branch it leads to) give 2^K different sums, and no result of
# any pattern's run but the right one's last equals the answer: a blind policy is then right
# with probability exactly 2^-K, every single wrong direction changes the answer, and no
# early stop (a city, a value, a partial sum) is right. The rates are measured in
# benchmarks/results/knockout_patterns.md.
KNOCKOUT_DIRECTIONS = (2, 3, 4)
KNOCKOUT_CITIES = 1 + max(KNOCKOUT_DIRECTIONS)  # a fresh challenger at every meeting
_FLIP_MODE = {"max": "min", "min": "max"}


def pattern_runs(calls: list[dict], world: World) -> dict[tuple[bool, ...], dict[int, Any]]:
  """Each direction pattern of a plan (a flag per `compare`, in plan order: its mode flipped or
  not; every other call as planned, resolved along the branch the pattern takes) -> the
  results of the plan's run, call index -> result."""
  compares = [i for i, c in enumerate(calls) if c["name"] == "compare"]
  tools, schedule = make_tools(world), canonical_schedule(calls)
  runs = {}
  for pattern in itertools.product((False, True), repeat=len(compares)):
    flipped = [dict(c) for c in calls]
    for i, f in zip(compares, pattern):
      if f:
        args = dict(calls[i]["arguments"])
        args["mode"] = _FLIP_MODE[args["mode"]]
        flipped[i] = {"name": "compare", "arguments": args}
    run = execute(flipped, tools, schedule)
    if run.error:
      raise RuntimeError(f"pattern {pattern}: the plan fails: {run.entries[-1]}")
    runs[pattern] = run.results
  return runs


def knockout_flaw(runs: dict[tuple[bool, ...], dict[int, Any]], last: int) -> Optional[str]:
  """Why a knockout world is refused, or None: two patterns' answers (result `last`) that are
  equal, or a result of some pattern's run, other than the right pattern's answer, that equals
  the right answer (an early stop, or a wrong branch, that would be rewarded)."""
  right = runs[tuple(False for _ in next(iter(runs)))][last]
  answers = [r[last] for r in runs.values()]
  if len(set(answers)) < len(answers):
    return "two direction patterns give one answer"
  for pattern, results in runs.items():
    for i, x in results.items():
      if x == right and not (i == last and not any(pattern)):
        return f"result {i} of pattern {pattern} equals the answer"
  return None


def _knockout(k: int):
  def build(rng, world):
    first = tuple(_pick(rng, world.cities, 2))
    fields = [rng.choice(CITY_FIELDS) for _ in range(k)]
    picks = [_mode(rng, CITY_MORE[f]) for f in fields]
    # Each challenger meets once, so no branch meets a city with itself (`compare` refuses a
    # single item, and a confused demonstration may take any branch).
    challengers = _pick(rng, set(world.cities) - set(first), k - 1)
    items = {first[0]: ref(0), first[1]: ref(1)}
    calls = [_city(first[0], fields[0]), _city(first[1], fields[0]),
             _call("compare", items=items, mode=picks[0][0])]
    won = [pick_ref(2, items)]  # each meeting's winning value, whichever branch it took
    words = [f"Of {first[0]} and {first[1]}, take the {picks[0][1]} city."]
    for i in range(1, k):
      c = len(calls) - 1  # the compare that named the holder
      calls += [_city(ref(c), fields[i]), _city(challengers[i - 1], fields[i])]
      items = {key_ref(c): ref(c + 1), challengers[i - 1]: ref(c + 2)}
      calls.append(_call("compare", items=items, mode=picks[i][0]))
      won.append(pick_ref(len(calls) - 1, items))
      words.append(f"Of that city and {challengers[i - 1]}, take the {picks[i][1]} one.")
    # The running total: meetings 0 and 1's winning values, then each next meeting's (each add
    # lands in the step after the compare it needs: `canonical_schedule`).
    calls.append(_call("calculate", op="add", a=won[0], b=won[1]))
    for w in won[2:]:
      calls.append(_call("calculate", op="add", a=ref(len(calls) - 1), b=w))
    flaw = knockout_flaw(pattern_runs(calls, world), len(calls) - 1)
    if flaw:
      raise Unfit(flaw)
    return " ".join(words) + " What is the sum of the winning values?", calls
  return build


for _k in KNOCKOUT_DIRECTIONS:  # one world size for every K: K alone differs
  _template(2 * _k + 1, True, directions=_k, family="knockout", name=f"knockout_cities_{_k}",
            cities=KNOCKOUT_CITIES)(_knockout(_k))
