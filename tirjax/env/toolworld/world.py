"""A small fictional world, drawn afresh for every query from its own `random.Random`.

People live in cities and work for companies; companies have a head-quarters city, a revenue
and a staff count; cities have a population, a temperature and an elevation; every pair of cities
has a distance. Names are made-up syllable strings, so nothing can be answered from memory.

Names come from fixed pools (`NAME_POOLS`, a few hundred names drawn once with the same syllable
rules), so that the toolworld tokenizer can give every name a single token: a tiny policy then
copies a name as one token instead of a string of syllables (copying errors, "Fizar" for
"Fizul", were what kept a 2-layer model from learning; issue 13).

Values are drawn so that answers are unambiguous: names are unique across kinds, each numeric
field (and each birth date, each distance) is distinct within a world with a relative gap of at
least `GAP`, and companies have distinct head-quarters. So a wrong entity anywhere in a chain of
look-ups leads to a different answer.
"""

from __future__ import annotations

import dataclasses
import datetime
import random
from typing import Any

CONSONANTS = "bdfgklmnprstvz"
VOWELS = "aeiou"
GAP = 0.03  # minimum relative gap between two values of one numeric field

N_PEOPLE, N_COMPANIES, N_CITIES = 5, 3, 4
MAX_CITIES = 6  # the largest world (`make_world`'s n_cities) whose values spread with GAP
PERSON_FIELDS = ("city", "company", "born")
COMPANY_FIELDS = ("hq", "revenue", "staff")
CITY_FIELDS = ("population", "temp_c", "elevation_m")
# Inclusive ranges of the numeric fields.
RANGES = {"revenue": (10, 990), "staff": (5, 950), "population": (100, 9900),
          "temp_c": (-5, 35), "elevation_m": (5, 2900), "distance": (20, 2900)}
BORN_RANGE = (datetime.date(1960, 1, 1), datetime.date(2004, 12, 31))


def _syllable(rng: random.Random) -> str:
  return rng.choice(CONSONANTS) + rng.choice(VOWELS)


def _pool(rng: random.Random, k: int, make, taken: set) -> tuple[str, ...]:
  out = []
  while len(out) < k:
    name = make(rng).capitalize()
    if not any(name.startswith(t) or t.startswith(name) for t in taken):
      taken.add(name)
      out.append(name)
  return tuple(out)


def _name_pools(seed: int = 20261201) -> dict[str, tuple[str, ...]]:
  """Unique, made-up names per kind (no name is another's prefix: each ends a token)."""
  rng, taken = random.Random(seed), set()
  return {"people": _pool(rng, POOL_SIZES["people"], lambda r: _syllable(r) + _syllable(r), taken),
          "cities": _pool(rng, POOL_SIZES["cities"],
                          lambda r: _syllable(r) + _syllable(r) + r.choice("nlr"), taken),
          "companies": _pool(rng, POOL_SIZES["companies"],
                             lambda r: _syllable(r) + r.choice(CONSONANTS) + "co", taken)}


POOL_SIZES = {"people": 160, "cities": 120, "companies": 60}
NAME_POOLS = _name_pools()
ALL_NAMES = tuple(n for pool in NAME_POOLS.values() for n in pool)


def _spread(rng: random.Random, lo: int, hi: int, k: int) -> list[int]:
  """k distinct ints in [lo, hi], pairwise |a - b| >= max(1, GAP * max(|a|, |b|))."""
  out: list[int] = []
  while len(out) < k:
    v = rng.randint(lo, hi)
    if all(abs(v - u) >= max(1.0, GAP * max(abs(v), abs(u))) for u in out):
      out.append(v)
  return out


def random_date(rng: random.Random, lo: datetime.date, hi: datetime.date) -> datetime.date:
  return lo + datetime.timedelta(days=rng.randint(0, (hi - lo).days))


def pair_key(a: str, b: str) -> str:
  return "|".join(sorted((a, b)))


@dataclasses.dataclass(frozen=True)
class World:
  """Plain JSON-like data: `people[name] = {"city", "company", "born"}` and so on."""

  people: dict[str, dict[str, Any]]
  companies: dict[str, dict[str, Any]]
  cities: dict[str, dict[str, Any]]
  distances: dict[str, int]  # pair_key(a, b) -> km

  def as_dict(self) -> dict:
    """A copy as nested plain dicts."""
    return {"people": {k: dict(v) for k, v in self.people.items()},
            "companies": {k: dict(v) for k, v in self.companies.items()},
            "cities": {k: dict(v) for k, v in self.cities.items()},
            "distances": dict(self.distances)}

  @classmethod
  def from_dict(cls, d: dict) -> "World":
    return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls)})


def make_world(rng: random.Random, n_cities: int = N_CITIES) -> World:
  """A random world; `n_cities` (at least N_COMPANIES, for their headquarters) is larger for
  the templates that need more cities (`queries.Template.cities`)."""
  if not N_COMPANIES <= n_cities <= MAX_CITIES:
    raise ValueError(f"n_cities: must be in [{N_COMPANIES}, {MAX_CITIES}], got {n_cities}")
  people = rng.sample(NAME_POOLS["people"], N_PEOPLE)
  cities = rng.sample(NAME_POOLS["cities"], n_cities)
  companies = rng.sample(NAME_POOLS["companies"], N_COMPANIES)
  city_values = {f: _spread(rng, *RANGES[f], n_cities) for f in CITY_FIELDS}
  company_values = {f: _spread(rng, *RANGES[f], N_COMPANIES) for f in ("revenue", "staff")}
  hqs = rng.sample(cities, N_COMPANIES)
  born_lo, born_hi = BORN_RANGE
  born_days = rng.sample(range((born_hi - born_lo).days + 1), N_PEOPLE)
  pairs = [(a, b) for i, a in enumerate(cities) for b in cities[i + 1:]]
  distances = _spread(rng, *RANGES["distance"], len(pairs))
  return World(
      people={p: {"city": rng.choice(cities), "company": rng.choice(companies),
                  "born": (born_lo + datetime.timedelta(days=d)).isoformat()}
              for p, d in zip(people, born_days)},
      companies={c: {"hq": hqs[i], "revenue": company_values["revenue"][i],
                     "staff": company_values["staff"][i]} for i, c in enumerate(companies)},
      cities={c: {f: city_values[f][i] for f in CITY_FIELDS} for i, c in enumerate(cities)},
      distances={pair_key(a, b): d for (a, b), d in zip(pairs, distances)})
