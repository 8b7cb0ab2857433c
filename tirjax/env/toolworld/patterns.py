"""What a policy that is blind to the directions, or that stops early, earns on a chain task.

A chain task (the knockout family, `queries.pattern_runs`) has K compares; a direction pattern
flips some of them and makes every other call right on the branch that follows. A policy that
takes each direction by a fair coin and everything else right is right with probability

    P(blind) = 2^-K · Σ_patterns 1[answer(pattern) matches the reference],

which is exactly 2^-K when the 2^K patterns' answers are different (each pattern has weight
2^-K; only the pattern with no flip gives the reference). It is the success rate a warm start
on confused demonstrations (each direction a coin flip, `demos.confuse`) starts from, and the
floor a credit-assignment testbed needs (issue 51: ~2^-K, not K + 1 cities' worth more). An
early answer is any result of the right pattern's run but its last (a city a compare named, a
looked-up value, a partial sum): `early_hits` counts those the judge would take for the
reference, which must be none, or the outcome pays for skipping the later decisions. Answers
are judged by the rule judge (`judge.matches`), as an episode's are.
"""

from __future__ import annotations

from tirjax.env.judge import matches
from tirjax.env.tools import Task
from tirjax.env.toolworld.plan import format_answer
from tirjax.env.toolworld.queries import pattern_runs
from tirjax.env.toolworld.world import World


def _runs(task: Task):
  plan = task.metadata["plan"]
  return pattern_runs(plan, World.from_dict(task.metadata["world"])), len(plan) - 1


def blind_success(task: Task) -> float:
  """P(blind) above, by enumerating the 2^K patterns (exact, no sampling)."""
  runs, last = _runs(task)
  hits = sum(matches(format_answer(r[last]), task.answer) for r in runs.values())
  return hits / len(runs)


def early_hits(task: Task, every_branch: bool = False) -> int:
  """How many results that come before the answer match it: of the right pattern's run, or
  (`every_branch`) of every pattern's run (a wrong branch's intermediate, or its answer)."""
  runs, last = _runs(task)
  right = tuple(False for _ in next(iter(runs)))
  return sum(matches(format_answer(x), task.answer)
             for pattern, results in runs.items() if every_branch or pattern == right
             for i, x in results.items() if not (pattern == right and i == last))
