"""toolworld as a registered environment (`tirjax.env.registry`): tasks drawn per query from a
seed (disjoint train and eval splits), SFT demonstrations, its own BPE tokenizer, the
direction probe added to each evaluation, and turns labelled from each query's plan."""

from __future__ import annotations

import dataclasses
from typing import Sequence

from tirjax.config import Preset
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


HEADROOM = Preset("toolworld_headroom", when={"model": "tiny"}, doc="""\
Toolworld with the tiny model (`make run`), designed so that RL has headroom and a lever on a
2-core CPU (issue 26; benchmarks/results/default_run.json).

The warm start: 1200 SFT steps at lr 1e-2 on demonstrations that never show which way a
direction-taking tool must be called (`sft.demos.p_confuse=1`: both directions demonstrated),
on queries that all need a direction (`env.toolworld.p_direction=1`) with 1-3 hops
(`hop_weights`). SFT then teaches the format, the plan and the copying of names and values but
leaves the direction a coin flip, which only outcomes can teach (the warm starts' accuracy,
headroom and mixed groups: benchmarks/results/default_run.json).

RL: 8 queries x 6 rows per step in 4 mini-batches (4 updates per rollout batch, as verl's
default), sampled at T = 0.6 with the loss on the tempered policy (`train.tempered_policy`),
lr 3e-4, 40 steps; what RL gains, mostly by removing direction failures:
benchmarks/results/default_run.json.

Why 1200 steps: with 600, the warm starts' accuracy depended on the CPU (the same seed's SFT
differs by CPU), and where they miscopied names and values RL had nothing to take
(benchmarks/results/default_run_sft600*.json). At T = 1 the same budget gained less, and lr
1e-3 collapsed (entropy up, accuracy down).""", values={
    "train.steps": 40,
    "sft.steps": 1200,
    "step.logprob_chunk_size": 2048,  # the whole row: fewer, larger matmuls on the CPU
    "env.toolworld.p_direction": 1.0,
    "env.toolworld.hop_weights": (0.35, 0.45, 0.2, 0.0),
    "sft.demos.p_confuse": 1.0,
    "train.queries_per_step": 8,
    "train.mini_batch_queries": 2,
    "rollout.n": 6,
    "rollout.temperature": 0.6,
    "train.tempered_policy": True})

ENVIRONMENT = register(Environment(
    "toolworld", draw=draw, demonstrations=demonstrations, tokenizer=tokenizer,
    eval_extras=direction_probe, turn_labels=turn_labels, failure_kind=failure_kind,
    failure_shares=failure_shares, options=Difficulty, check=check, presets=(HEADROOM,),
    gold_answers=True))
