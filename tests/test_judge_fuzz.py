"""The rule judge's verdicts are rewards, so a policy finds every false positive: fuzzing it
with near misses of real golds (toolworld's and ToolHop's), none of which may pass, while every
gold, plainly written, does (issue 15)."""

import functools
import json
import os
import random

import pytest

from tirjax.env import judge as J
from tirjax.env.tools import UNABLE_TO_ANSWER
from tirjax.env.toolworld import make_tasks

pytestmark = pytest.mark.slow  # left out of `make test-fast`

TOOLHOP = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "toolhop",
                       "toolhop100.jsonl")
PER_DATASET = 10_000


def toolworld_golds():
  return sorted({t.answer for t in make_tasks("train", 600, seed=5) if t.answer != UNABLE_TO_ANSWER})


def toolhop_golds():
  if not os.path.exists(TOOLHOP):
    pytest.skip(f"{TOOLHOP}: the ToolHop data is not there")
  with open(TOOLHOP) as f:
    return sorted({json.loads(line)["answer"] for line in f})


def _digit_change(g, rng):
  positions = [i for i, c in enumerate(g) if c.isdigit()]
  i = rng.choice(positions)
  return g[:i] + rng.choice([d for d in "0123456789" if d != g[i]]) + g[i + 1:]


def _char_change(g, rng):
  i = rng.randrange(len(g))
  letters = "abcdefghijklmnopqrstuvwxyz"
  return g[:i] + rng.choice([c for c in letters if c != g[i].lower()]) + g[i + 1:]


@functools.cache
def _other_golds(gold, others):
  """The golds that differ from `gold` once normalised (and in value, for a number), in order:
  computed once per gold, not once per near miss (the draws are the same)."""
  value = J.parse_number(gold)
  return [o for o in others if J.normalize(o) != J.normalize(gold)
          and (value is None or J.parse_number(o) != value)]


def near_misses(gold, others, rng):
  """One wrong answer for `gold`: a changed character, a list, a hedge, or another gold."""
  other = rng.choice(_other_golds(gold, tuple(others)))
  numeric = J.parse_number(gold) is not None
  kinds = [lambda: f"{gold} or {other}", lambda: f"{other} or {gold}",
           lambda: f"{other}, {gold}", lambda: f"{gold}, {other}", lambda: f"maybe {gold}",
           lambda: f"probably {gold}", lambda: f"not {gold}", lambda: f"{gold} {other}",
           lambda: f"{other} {gold}", lambda: other, lambda: f"The answer is {other}.",
           lambda: f"either {gold} or {other}", lambda: f"{gold}; {other}"]
  if numeric:
    kinds += [lambda: _digit_change(gold, rng), lambda: gold + rng.choice("0123456789"),
              lambda: str(J.parse_number(gold) + rng.choice((-1, 1)) *
                          10.0 ** -J.decimals(gold)),
              lambda: f"about {gold}", lambda: f"{gold} or {_digit_change(gold, rng)}",
              lambda: ", ".join(str(k) for k in range(1, 10)) + f" or {gold}"]
  elif any(c.isalpha() for c in gold):
    kinds += [lambda: _char_change(gold, rng), lambda: gold[:-1] if len(gold) > 1 else other]
  return rng.choice(kinds)()


def is_wrong(answer, gold):
  """The oracle, independent of the judge: the answer differs from the gold once both are
  normalised, and names no other thing (near misses above are built so)."""
  g, a = J.parse_number(gold), J.parse_number(answer)
  if g is not None and a is not None:
    return round(a, J.decimals(gold)) != round(g, J.decimals(gold))
  return J.normalize(answer) != J.normalize(gold)


@pytest.mark.parametrize("dataset, golds", [("toolworld", toolworld_golds),
                                            ("toolhop", toolhop_golds)])
def test_no_near_miss_passes_and_every_gold_does(dataset, golds):
  golds = golds()
  rng = random.Random(13)
  false_positives, tried = [], 0
  while tried < PER_DATASET:
    gold = rng.choice(golds)
    answer = near_misses(gold, golds, rng)
    if not is_wrong(answer, gold):
      continue
    tried += 1
    if J.rule_verdict(answer, gold) == "true":
      false_positives.append((answer, gold))
  print(f"\n{dataset}: {len(false_positives)} false positives of {tried} near misses")
  assert not false_positives[:20]
  for gold in golds:
    for written in (gold, f"The answer is {gold}.", f"  {gold.upper()} ", f"Final answer: {gold}"):
      assert J.rule_verdict(written, gold) == "true", (written, gold)
