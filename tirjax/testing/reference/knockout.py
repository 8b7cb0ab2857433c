"""Plain-loop reference of `tirjax.env.toolworld.patterns` for knockout tasks.

Reads the meetings off a knockout plan (the two first cities, each challenger, each field and
mode) and plays every direction pattern by hand on the world's values, without the plan's
refs or the tools: the holder, each meeting's winning value, the running sum. The blind
success is the share of patterns whose sum is the reference; the early answers are every
value the right pattern shows before its sum (looked-up values, winners, partial sums).
"""

from __future__ import annotations

import itertools


def meetings(plan: list[dict]) -> tuple[tuple[str, str], list[tuple[str, str, str]]]:
  """(the first two cities, [(challenger, field, mode) per meeting]); the first meeting's
  challenger is "" (its two cities are the first two)."""
  first = (plan[0]["arguments"]["name"], plan[1]["arguments"]["name"])
  challengers, modes = [""], []
  for call in plan:
    if call["name"] == "compare":
      modes.append(call["arguments"]["mode"])
      challengers += [k for k in call["arguments"]["items"]
                      if not k.startswith("$ref:") and k not in first]
  fields = [plan[0]["arguments"]["field"]]
  for call in plan[2:]:  # each challenger's look-up names its meeting's field
    if call["name"] == "city_info" and isinstance(call["arguments"]["name"], str):
      fields.append(call["arguments"]["field"])
  return first, list(zip(challengers, fields, modes))


def play(world: dict, plan: list[dict], flips) -> tuple[int, list]:
  """(the sum, every value shown before it) with the meetings whose flag in `flips` is set
  decided the other way."""
  first, spec = meetings(plan)
  cities = world["cities"]
  holder, total, shown = None, 0, []
  for i, ((challenger, field, mode), flip) in enumerate(zip(spec, flips)):
    pair = first if i == 0 else (holder, challenger)
    values = [cities[x][field] for x in pair]
    take_max = (mode == "max") != bool(flip)
    w = 0 if (values[0] > values[1]) == take_max else 1
    holder = pair[w]
    total += values[w]
    shown += values + [holder] + ([total] if i >= 1 else [])
  shown.pop()  # the last partial sum is the answer itself
  return total, shown


def blind_success(world: dict, plan: list[dict], answer: str) -> float:
  k = sum(c["name"] == "compare" for c in plan)
  patterns = list(itertools.product((False, True), repeat=k))
  return sum(str(play(world, plan, p)[0]) == answer for p in patterns) / len(patterns)


def early_hits(world: dict, plan: list[dict], answer: str) -> int:
  k = sum(c["name"] == "compare" for c in plan)
  return sum(str(x) == answer for x in play(world, plan, (False,) * k)[1])
