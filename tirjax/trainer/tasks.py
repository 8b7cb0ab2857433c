"""Tasks and tokenizers by environment name (toolworld, ToolHop, FTRL, BFCL multi-turn).

toolworld draws fresh worlds per query from a seed, with disjoint train and eval splits. The
real datasets ship one file each; they are split deterministically by task id (a hash, one in
`EVAL_SHARE`), and their dataset-supplied tool code runs in one shared sandbox.
"""

from __future__ import annotations

import hashlib
import os
from typing import Sequence

import numpy as np

from tirjax.env import bandit
from tirjax.env.tools import Task
from tirjax.env.toolworld import Difficulty, build_tokenizer, make_tasks
from tirjax.env.toolworld.demos import DemoOptions, demo_tokens, make_demos

EVAL_SHARE = 5  # one task id in five goes to eval for the single-file datasets


def _split_of(task_id: str) -> str:
  bucket = hashlib.blake2b(task_id.encode(), digest_size=8).digest()[0] % EVAL_SHARE
  return "eval" if bucket == 0 else "train"


class TaskSource:
  """Train and eval tasks of one environment, loaded once (real datasets) or drawn (toolworld)."""

  def __init__(self, env_cfg, seed: int):
    self.name = env_cfg.name
    self._cfg = env_cfg
    self._seed = seed
    self._sandbox = None
    self._cache: dict[str, list[Task]] = {}

  def tasks(self, split: str, n: int, hop_weights: Sequence[float] = ()) -> list[Task]:
    """The first `n` tasks of `split` ("train", "eval", or "all" of a real dataset: a benchmark
    evaluated whole) (a fixed list: iterate over it with a data position);
    toolworld's `hop_weights`, when given, replace the environment's query mix (SFT's
    curriculum)."""
    if self.name == "doors":
      return bandit.make_tasks(split, n, seed=self._seed)
    if self.name == "toolworld":
      cfg = self._cfg
      difficulty = Difficulty(hop_weights=tuple(hop_weights or cfg.hop_weights),
                              p_parallel=cfg.p_parallel, p_down=cfg.p_down,
                              p_direction=cfg.p_direction,
                              chain_directions=cfg.chain_directions)
      return make_tasks(split, n, seed=self._seed, difficulty=difficulty)
    if split not in self._cache:
      every = self._load_all()
      self._cache = {s: [t for t in every if _split_of(t.task_id) == s] for s in ("train", "eval")}
    tasks = self._cache["train"] + self._cache["eval"] if split == "all" else self._cache[split]
    if not tasks:
      raise ValueError(f"env {self.name}: the {split} split is empty")
    return tasks[:n]

  def _load_all(self) -> list[Task]:
    from tirjax.env.datasets import load_bfcl, load_ftrl, load_toolhop
    from tirjax.env.sandbox import Sandbox
    self._sandbox = Sandbox()
    path = self._cfg.data_path
    if self.name in ("toolhop", "ftrl") and not os.path.exists(path):
      raise FileNotFoundError(f"env.data_path: {path!r} does not exist (env={self.name})")
    if self.name == "toolhop":
      return load_toolhop(path, self._sandbox)
    if self.name == "ftrl":
      return load_ftrl(path, self._sandbox)
    if self.name == "bfcl":
      return load_bfcl(self._sandbox, data_dir=path or None)
    raise ValueError(f"env.name: unknown environment {self.name!r}")

  def demonstrations(self, tasks: Sequence[Task], tokenizer, options: DemoOptions, num: int
                     ) -> list[tuple[list[int], list[int]]]:
    """(token ids, loss mask) of `num` SFT demonstrations of `tasks` (toolworld and doors)."""
    if self.name == "doors":
      return bandit.demonstrations(tasks, tokenizer, num, seed=self._seed)
    if self.name != "toolworld":
      raise ValueError(f"env {self.name}: has no demonstrations (toolworld and doors have)")
    return [demo_tokens(tokenizer, d)
            for d in make_demos(tasks[:num], seed=self._seed, options=options)]

  def close(self) -> None:
    if self._sandbox is not None:
      self._sandbox.close()


def cache_dir(configured: str = "") -> str:
  """Where built artefacts (toolworld's tokenizer) are cached: the config's `env.cache_dir`,
  else $TIRJAX_CACHE, else ~/.cache/tirjax. A build records its inputs, so a cached one is
  reused only when equal."""
  return configured or os.environ.get("TIRJAX_CACHE") or os.path.join(
      os.path.expanduser("~"), ".cache", "tirjax")


def load_tokenizer(directory: str):
  """The policy's tokenizer from `tokenizer_dir`'s answer."""
  from transformers import AutoTokenizer
  return AutoTokenizer.from_pretrained(directory)


def tokenizer_dir(model_cfg, env_name: str, cache_dir: str, seed: int = 0) -> str:
  """Where the policy's tokenizer files live (copied into HF exports): the checkpoint's own, or
  toolworld's BPE (plus one token per door for doors), built in `cache_dir` if needed."""
  if model_cfg.hf_checkpoint:
    return model_cfg.hf_checkpoint
  if env_name not in ("toolworld", "doors"):
    raise ValueError(f"model.hf_checkpoint: required for env={env_name} (the toolworld tokenizer "
                     "only covers toolworld and doors)")
  toolworld = build_tokenizer(os.path.join(cache_dir, f"toolworld_tokenizer_seed{seed}"), seed=seed)
  if env_name == "doors":
    return str(bandit.build_tokenizer(os.path.join(cache_dir, f"doors_tokenizer_seed{seed}"),
                                      toolworld))
  return str(toolworld)


class QueryOrder:
  """Which training queries step i uses: consecutive slices of epoch-seeded permutations.

  A pure function of the step, so a resumed run draws exactly the queries an uninterrupted
  run would. `extra(i, k)` gives DAPO's refill queries for round k of step i, from a separate
  stream.
  """

  def __init__(self, num_tasks: int, per_step: int, seed: int):
    self.n, self.per_step, self.seed = num_tasks, per_step, seed

  def _take(self, stream: int, start: int, count: int) -> list[int]:
    out = []
    while len(out) < count:
      epoch, offset = divmod(start + len(out), self.n)
      order = np.random.default_rng([self.seed, stream, epoch]).permutation(self.n)
      out.extend(int(q) for q in order[offset:offset + count - len(out)])
    return out

  def step(self, i: int) -> list[int]:
    return self._take(0, i * self.per_step, self.per_step)

  def extra(self, i: int, k: int, count: int) -> list[int]:
    return self._take(1 + k, i * count, count)
