"""The rollout shapes a split's tasks need, and a config's shapes fitted to them.

A task needs, of the fixed `Rollouts` sizes (spec §2; `tirjax.episodes.options.Shapes`):

  L  its prompt and one step: len(prompt ids) + `rollout.max_new_tokens` (the check of
     `episodes.episode.EpisodeRunner`; a longer row ends truncated, by design);
  C  its ground-truth calls: len(`Task.flat_gt_calls`) (`episodes.episode.check_task_fits`);
  P  the arguments of its ground-truth calls: the most of any one call (the same check);
  T_max  the steps that complete it: its ground-truth steps (`Task.gt_calls`) and one more per
     user turn (the answer; in a dialogue each turn's closing message).

A split needs the most of each over its tasks (`needs`). A shape set to `AUTO` in a config is
sized from those needs, rounded up to the sampler's compile buckets (powers of two,
`tirjax.sampling.jax_sampler.bucket`): C and P to hold the split's ground truth, T to
`rollout.max_steps`, and L to hold the longest prompt and `rollout.max_steps` steps of
`max_new_tokens` (tool responses share that room; a row that outgrows L ends truncated). A
shape set to a number must hold the split's need; `fit` names every one that does not, once.
T_max itself is the protocol's (HiDiffTIR: 10, PORTool: 6): below the steps the split needs,
some tasks cannot be completed, which `short_steps` says, but the arrays still fit.
"""

from __future__ import annotations

import dataclasses
from typing import Collection, Optional, Sequence

from tirjax.env.tools import Task
from tirjax.episodes.options import Shapes
from tirjax.sampling.jax_sampler import bucket

AUTO = "auto"
SIZED = ("max_tokens", "max_gt_calls", "max_params", "max_steps")  # the keys `AUTO` may take


@dataclasses.dataclass(frozen=True)
class Need:
  """The most a split's tasks need of one size, and the first task that needs that much."""

  value: int
  task_id: str = ""


@dataclasses.dataclass(frozen=True)
class Needs:
  """What the tasks of a split need (module docstring): its longest prompt, most ground-truth
  calls, most arguments of one call, and most steps to complete a task."""

  prompt_tokens: Need
  gt_calls: Need
  params: Need
  steps: Need
  tasks: int

  @classmethod
  def none(cls) -> "Needs":
    """The needs of no task (a prompt holds at least one token)."""
    return cls(Need(1), Need(0), Need(0), Need(0), tasks=0)


def task_steps(task: Task) -> int:
  """The fewest steps that complete `task`: its ground-truth steps and one per user turn."""
  turns = 1 + len(task.dialogue.user_turns) if task.dialogue is not None else 1
  return len(task.gt_calls) + turns


def needs(tasks: Sequence[Task], prompt_lengths: Sequence[int]) -> Needs:
  """What `tasks` need, `prompt_lengths[i]` being the token count of task i's prompt
  (`chat.render_prompt_ids`)."""
  if len(tasks) != len(prompt_lengths):
    raise ValueError(f"prompt_lengths: {len(prompt_lengths)} lengths for {len(tasks)} tasks")
  if not tasks:
    return Needs.none()

  def most(values: Sequence[int]) -> Need:
    i = max(range(len(tasks)), key=lambda j: (values[j], -j))  # the first of the largest
    return Need(int(values[i]), tasks[i].task_id)

  return Needs(
      prompt_tokens=most(prompt_lengths),
      gt_calls=most([len(t.flat_gt_calls) for t in tasks]),
      params=most([max((len(c.get("arguments") or {}) for c in t.flat_gt_calls), default=0)
                   for t in tasks]),
      steps=most([task_steps(t) for t in tasks]), tasks=len(tasks))


def minimums(n: Needs, max_new_tokens: int) -> dict[str, int]:
  """The least L, C and P that hold every task of `n`."""
  return {"max_tokens": n.prompt_tokens.value + max_new_tokens,
          "max_gt_calls": max(n.gt_calls.value, 1), "max_params": max(n.params.value, 1)}


def sized(n: Needs, max_new_tokens: int, max_steps: int) -> dict[str, int]:
  """`AUTO`'s value of each key of `SIZED` for needs `n` (module docstring)."""
  least = minimums(n, max_new_tokens)
  return {"max_tokens": bucket(n.prompt_tokens.value + max_steps * max_new_tokens, 1),
          "max_gt_calls": bucket(least["max_gt_calls"], 1),
          "max_params": bucket(least["max_params"], 1), "max_steps": max_steps}


def floors(auto: Collection[str], max_new_tokens, max_steps) -> dict[str, int]:
  """The `auto` keys sized for no task: valid `Shapes` values before the data is read (the raw
  config's T_max and new tokens; a bad one is named by `RolloutOptions`, so 1 stands in)."""
  def count(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1
  values = sized(Needs.none(), count(max_new_tokens), count(max_steps))
  return {k: values[k] for k in auto}


def fit(shapes: Shapes, auto: Collection[str], n: Needs, max_new_tokens: int,
        max_steps: int, split: str = "the split") -> Shapes:
  """`shapes` with the `auto` keys sized for `n` and the others checked against it.

  Raises:
    ValueError: naming every shape that cannot hold `n`, its minimum and the task that needs
      it (the message starts with the first such key).
  """
  unknown = sorted(set(auto) - set(SIZED))
  if unknown:
    raise ValueError(f"{unknown[0]}: cannot be {AUTO!r} (only {', '.join(SIZED)} can)")
  why = {"max_tokens": (n.prompt_tokens, f"a prompt of {n.prompt_tokens.value:,} tokens and one "
                                         f"step of rollout.max_new_tokens={max_new_tokens}"),
         "max_gt_calls": (n.gt_calls, f"{n.gt_calls.value} ground-truth calls"),
         "max_params": (n.params, f"a ground-truth call with {n.params.value} arguments")}
  short = [(key, least) for key, least in minimums(n, max_new_tokens).items()
           if key not in auto and getattr(shapes, key) < least]
  if short:
    items = [f"{key} >= {least:,} (now {getattr(shapes, key):,}; task {why[key][0].task_id}: "
             f"{why[key][1]})" for key, least in short]
    raise ValueError(f"{short[0][0]}: the {n.tasks} tasks of {split} need " + ", ".join(items)
                     + f"; set them so, or to {AUTO!r} to size them from the data")
  values = sized(n, max_new_tokens, max_steps)
  return dataclasses.replace(shapes, **{k: values[k] for k in auto})


def short_steps(n: Needs, max_steps: int, split: str = "the split") -> Optional[str]:
  """A warning when T_max (`max_steps`) is below the steps that complete some task of `n`."""
  if n.steps.value <= max_steps:
    return None
  return (f"rollout.max_steps={max_steps}: task {n.steps.task_id} of {split} takes "
          f"{n.steps.value} steps to complete (its ground truth's steps and one per user turn); "
          f"its episodes end unfinished at T_max. rollout.max_steps={n.steps.value} would hold "
          "it (and rollout.shapes.max_steps with it)")

