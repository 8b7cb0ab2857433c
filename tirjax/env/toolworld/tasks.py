"""Toolworld tasks: deterministic train / eval splits with difficulty knobs.

Task k of a stream is drawn from its own `random.Random(seed_k)`: a hop count, a template of
that many hops, a fresh world that can host it, and (with probability `p_down`) one tool of the
plan that is "down" (answers "service unavailable"), which makes the reference answer
`unable_to_answer`. The ground truth `gt_calls` is the plan's canonical schedule, executed by
the tools themselves; for a down query it stops at the step whose call fails.

Splits partition one stream by a hash of the question text (one question in `EVAL_BUCKETS`
goes to eval), so no question text of eval appears in train, for every `n` and `seed`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from typing import Optional

from tirjax import option_checks
from tirjax.env.tools import UNABLE_TO_ANSWER, Task
from tirjax.env.toolworld.plan import canonical_schedule, execute, format_answer
from tirjax.env.toolworld.queries import DIRECTION_PARAMS, TEMPLATES, Unfit
from tirjax.env.toolworld.toolbox import make_tools
from tirjax.env.toolworld.world import World, make_world

SPLITS = ("train", "eval")
EVAL_BUCKETS = 10  # one bucket of ten goes to eval
MAX_HOPS = 4


@dataclasses.dataclass(frozen=True)
class Difficulty:
  """Knobs of the query mix.

  Attributes:
    hop_weights: relative frequency of queries with 1, 2, 3, 4 hops (tool-call steps).
    p_parallel: among queries of 2+ hops, the share whose plan has a step of parallel calls
      (there is no 1-hop parallel template).
    p_down: share of queries with a needed tool down (reference `unable_to_answer`).
    p_direction: share of queries drawn among the templates whose plan takes a direction the
      question states (compare, sort, filter, convert: `queries.DIRECTION_TOOLS`); the others
      are drawn among all templates. Every hop count and parallel kind has such templates. 1:
      every query hinges on a direction, which demonstrations with `p_confuse` leave to
      chance, so that only RL can teach it. 0 (default) draws exactly the streams before this
      knob existed.
    chain_directions: 0 (default), or the number of direction-taking calls, each in a step of
      its own, that every query then has: queries are drawn among the chain templates with that
      many (`queries.Template.directions`; the credit testbed, where an outcome cannot say
      which of its directions went wrong), and `p_parallel` and `p_direction` play no part.
      At 0 the chain templates are never drawn, so the streams stay those of before the knob.
    chain_family: with `chain_directions`, which family of chains: "" (default) the first
      chains (4 hops, 2 directions), drawn by `hop_weights`; "knockout" the knockout chains
      (`queries.knockout_cities_<K>`: 2K + 1 steps, K = 2, 3 or 4 directions, the answer a sum
      that each direction pattern makes different), one query family
      at every K (the credit testbed's dose-response), whose K fixes the hops, so that
      `hop_weights` plays no part either.
  """

  hop_weights: tuple[float, ...] = (0.25, 0.35, 0.25, 0.15)
  p_parallel: float = 0.5
  p_down: float = 0.1
  p_direction: float = 0.0
  chain_directions: int = 0
  chain_family: str = ""

  def __post_init__(self):
    w = self.hop_weights
    if len(w) != MAX_HOPS or any(x < 0 for x in w) or sum(w) <= 0:
      raise ValueError(f"hop_weights: need {MAX_HOPS} non-negative weights with a positive sum, "
                       f"got {w}")
    for name in ("p_parallel", "p_down", "p_direction"):
      option_checks.lies_in(name, getattr(self, name), 0, 1)
    option_checks.int_at_least("chain_directions", self.chain_directions, 0)
    families = sorted({t.family for t in TEMPLATES.values()})
    if self.chain_family not in families:
      raise ValueError(f"chain_family: must be one of {families}, got {self.chain_family!r}")
    if self.chain_family:
      if not _family_templates(self.chain_family, self.chain_directions):
        have = sorted({t.directions for t in TEMPLATES.values()
                       if t.family == self.chain_family})
        raise ValueError(f"chain_family={self.chain_family!r} needs chain_directions in {have}, "
                         f"got {self.chain_directions}")
    elif self.chain_directions:
      hops = {t.hops for t in TEMPLATES.values() if t.directions == self.chain_directions
              and t.directions > 1 and not t.family}
      wanted = {h + 1 for h, x in enumerate(w) if x > 0}
      if not hops or not wanted <= hops:
        raise ValueError(f"chain_directions={self.chain_directions}: the chain templates with "
                         f"that many directions have hops {sorted(hops)}; hop_weights {w} "
                         f"also weighs hops {sorted(wanted - hops)}")


def _family_templates(family: str, directions: int) -> list[str]:
  return sorted(t.name for t in TEMPLATES.values()
                if t.family == family and t.directions == directions)


def query_seed(seed: int, k: int) -> int:
  return int.from_bytes(hashlib.blake2b(f"toolworld:{seed}:{k}".encode(), digest_size=8).digest(),
                        "little")


def split_of(question: str) -> str:
  bucket = hashlib.blake2b(question.encode(), digest_size=8).digest()[0] % EVAL_BUCKETS
  return "eval" if bucket == 0 else "train"


def _draw(rng: random.Random, difficulty: Difficulty):
  if difficulty.chain_family:  # its own path: the other knobs' draws are not made
    return _drawn(rng, difficulty, TEMPLATES[rng.choice(
        _family_templates(difficulty.chain_family, difficulty.chain_directions))])
  hops = rng.choices(range(1, MAX_HOPS + 1), weights=difficulty.hop_weights)[0]
  parallel = hops > 1 and rng.random() < difficulty.p_parallel
  # No draw at p_direction = 0: the streams stay those of before the knob.
  direction = difficulty.p_direction > 0 and rng.random() < difficulty.p_direction
  if difficulty.chain_directions:
    names = [t.name for t in TEMPLATES.values()
             if t.hops == hops and t.directions == difficulty.chain_directions and not t.family]
  else:
    names = [t.name for t in TEMPLATES.values() if t.directions <= 1 and t.hops == hops
             and t.parallel == parallel and (t.direction or not direction)]
  return _drawn(rng, difficulty, TEMPLATES[rng.choice(sorted(names))])


def _drawn(rng: random.Random, difficulty: Difficulty, template):
  """A world that hosts `template`, the query, and the tool that is down (if any)."""
  while True:
    world = make_world(rng, template.cities)
    try:
      question, calls = template.build(rng, world)
      break
    except Unfit:
      continue
  down = (rng.choice(sorted({c["name"] for c in calls}))
          if rng.random() < difficulty.p_down else None)
  return template, world, question, calls, down


def build_task(task_id: str, template_name: str, world: World, question: str, calls: list[dict],
               down: Optional[str]) -> Task:
  """A task from its parts: tools bound to the world, gt calls and answer by execution."""
  schedule = canonical_schedule(calls)
  up = execute(calls, make_tools(world), schedule)
  if up.error:
    raise RuntimeError(f"{task_id}: the plan of {template_name!r} fails with every tool up")
  answer_if_up = format_answer(up.results[len(calls) - 1])
  tools = make_tools(world, down)
  run = execute(calls, tools, schedule) if down else up
  template = TEMPLATES[template_name]
  return Task(
      task_id=task_id, question=question, tools=tools,
      answer=UNABLE_TO_ANSWER if down else answer_if_up, gt_calls=run.steps,
      direction_params=DIRECTION_PARAMS,
      metadata={"env": "toolworld", "template": template_name, "hops": template.hops,
                "parallel": template.parallel, "down": down, "plan": calls,
                "answer_if_up": answer_if_up, "world": world.as_dict()})


def make_tasks(split: str, n: int, seed: int = 0,
               difficulty: Difficulty = Difficulty()) -> list[Task]:
  """The first `n` tasks of `split` in the stream `seed` (deterministic)."""
  if split not in SPLITS:
    raise ValueError(f"split: must be one of {SPLITS}, got {split!r}")
  if n < 0:
    raise ValueError(f"n: must be >= 0, got {n}")
  tasks: list[Task] = []
  k = 0
  while len(tasks) < n:
    template, world, question, calls, down = _draw(random.Random(query_seed(seed, k)), difficulty)
    if split_of(question) == split:
      tasks.append(build_task(f"toolworld-{seed}-{k}", template.name, world, question, calls,
                              down))
    k += 1
  return tasks


def task_from_metadata(task_id: str, question: str, metadata: dict) -> Task:
  """Rebuilds a task (with its tool callables) from its JSON-serialisable metadata."""
  return build_task(task_id, metadata["template"], World.from_dict(metadata["world"]), question,
                    metadata["plan"], metadata["down"])
