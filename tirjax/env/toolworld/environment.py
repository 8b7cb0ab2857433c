"""toolworld as a registered environment (`tirjax.env.registry`): tasks drawn per query from a
seed (disjoint train and eval splits), SFT demonstrations, its own BPE tokenizer, the
direction probe added to each evaluation, and turns labelled from each query's plan."""

from __future__ import annotations

import dataclasses
from typing import Sequence

from tirjax.env.registry import Environment, register
from tirjax.env.tools import Task
from tirjax.env.toolworld.demos import demo_tokens, make_demos
from tirjax.env.toolworld.failures import failure_kind, failure_shares, turn_labels
from tirjax.env.toolworld.tasks import Difficulty, make_tasks
from tirjax.env.toolworld.tokenizer import build_tokenizer


def difficulty(env_cfg, hop_weights: tuple = ()) -> Difficulty:
  """The query mix of `env_cfg` (its options, `env.toolworld`; `hop_weights`, when given,
  replace theirs: SFT's curriculum). Raises ValueError("<field>: ...") for a bad value."""
  own = env_cfg.options
  return dataclasses.replace(own, hop_weights=tuple(hop_weights)) if hop_weights else own


def draw(env_cfg, seed: int, split: str, n: int, hop_weights: tuple) -> list[Task]:
  return make_tasks(split, n, seed=seed, difficulty=difficulty(env_cfg, hop_weights))


def demonstrations(tasks: Sequence[Task], tokenizer, options, num: int, seed: int) -> list:
  return [demo_tokens(tokenizer, d) for d in make_demos(tasks[:num], seed=seed, options=options)]


def tokenizer(cache_dir: str, seed: int) -> str:
  import os  # noqa: PLC0415
  return str(build_tokenizer(os.path.join(cache_dir, f"toolworld_tokenizer_seed{seed}"),
                             seed=seed))


def direction_probe(model, tokenizer, tasks: Sequence[Task], answer_protocol: str) -> dict:
  from tirjax.env.toolworld.direction import direction_preference  # noqa: PLC0415 (jax)
  return direction_preference(model, tokenizer, tasks, answer_protocol)


def check(env_cfg, hop_weights: tuple) -> None:
  difficulty(env_cfg, hop_weights)


ENVIRONMENT = register(Environment(
    "toolworld", draw=draw, demonstrations=demonstrations, tokenizer=tokenizer,
    eval_extras=direction_probe, turn_labels=turn_labels, failure_kind=failure_kind,
    failure_shares=failure_shares, options=Difficulty, check=check))
