"""A run's tasks, demonstrations and tokenizer, from its environment's registry entry
(`tirjax.env.environments`).

Generated environments (toolworld, doors) draw their tasks from a seed. The real datasets
ship one file each; they are split deterministically by task id (a hash, one in
`EVAL_SHARE`), and their dataset-supplied tool code runs in one shared sandbox.
"""

from __future__ import annotations

import hashlib
import os
from typing import Sequence

import numpy as np

from tirjax import distributed
from tirjax.env import environments
from tirjax.env.tools import Task
from tirjax.env.toolworld.demos import DemoOptions

EVAL_SHARE = 5  # one task id in five goes to eval for the single-file datasets


def _split_of(task_id: str) -> str:
  bucket = hashlib.blake2b(task_id.encode(), digest_size=8).digest()[0] % EVAL_SHARE
  return "eval" if bucket == 0 else "train"


class TaskSource:
  """Train and eval tasks of one environment, loaded once (real datasets) or drawn (toolworld).

  A real dataset is read whole once, without its tool code, to split it; the tool code of the
  tasks asked for is then defined in the source's sandbox, each task's once (an evaluation of
  a few tasks does not define the whole dataset's). With `run_tools=False` none is defined (no
  sandbox starts): the tasks hold their text, tool schemas and ground truth, enough to size
  shapes, but their tools cannot run."""

  def __init__(self, env_cfg, seed: int, run_tools: bool = True):
    self.name = env_cfg.name
    self._cfg = env_cfg
    self._seed = seed
    self._run_tools = run_tools
    self._sandbox = None
    self._splits: dict[str, list[Task]] = {}  # the dataset's tasks by split, tools undefined
    self._defined: dict[str, Task] = {}  # tasks whose tools are defined, by id

  def tasks(self, split: str, n: int, hop_weights: Sequence[float] = ()) -> list[Task]:
    """The first `n` tasks of `split` ("train", "eval", or "all" of a real dataset: a benchmark
    evaluated whole) (a fixed list: iterate over it with a data position);
    toolworld's `hop_weights`, when given, replace the environment's query mix (SFT's
    curriculum)."""
    env = environments.get(self.name)
    if env.draw is not None:
      return env.draw(self._cfg, self._seed, split, n, tuple(hop_weights))
    if not self._splits:
      every = self._load(None)
      self._splits = {s: [t for t in every if _split_of(t.task_id) == s]
                      for s in ("train", "eval")}
    tasks = (self._splits["train"] + self._splits["eval"] if split == "all"
             else self._splits[split])[:n]
    if not tasks:
      raise ValueError(f"env {self.name}: the {split} split is empty")
    return self._with_tools(tasks) if self._run_tools else tasks

  def _with_tools(self, tasks: Sequence[Task]) -> list[Task]:
    """`tasks` with their tool code defined in the source's sandbox (each task once)."""
    missing = {t.task_id for t in tasks} - set(self._defined)
    if missing:
      from tirjax.env.sandbox import Sandbox  # pylint: disable=import-outside-toplevel
      self._sandbox = self._sandbox or Sandbox()
      self._defined.update((t.task_id, t) for t in self._load(self._sandbox, missing))
    return [self._defined[t.task_id] for t in tasks]

  def _load(self, sandbox, only=None) -> list[Task]:
    """The dataset's tasks (of ids `only`, if given), their code defined in `sandbox` (None:
    not defined)."""
    env = environments.get(self.name)
    path = self._cfg.data_path
    if env.needs_data_file and not os.path.exists(path):
      raise FileNotFoundError(f"env.data_path: {path!r} does not exist (env={self.name})")
    return env.load(path, sandbox, only)

  def demonstrations(self, tasks: Sequence[Task], tokenizer, options: DemoOptions, num: int
                     ) -> list[tuple[list[int], list[int]]]:
    """(token ids, loss mask) of `num` SFT demonstrations of `tasks`."""
    make = environments.get(self.name).demonstrations
    if make is None:
      have = " and ".join(environments.names("demonstrations"))
      raise ValueError(f"env {self.name}: has no demonstrations ({have} have)")
    return make(tasks, tokenizer, options, num, self._seed)

  def close(self) -> None:
    if self._sandbox is not None:
      self._sandbox.close()


def cache_dir(configured: str = "") -> str:
  """Where built artefacts (toolworld's tokenizer) are cached: the config's `env.cache_dir`,
  else $TIRJAX_CACHE, else ~/.cache/tirjax. A build records its inputs, so a cached one is
  reused only when equal."""
  return configured or os.environ.get("TIRJAX_CACHE") or os.path.join(
      os.path.expanduser("~"), ".cache", "tirjax")


def shared_tokenizer_dir(model_cfg, env_cfg, seed: int = 0) -> str:
  """`tokenizer_dir` for a run's processes: built once by process 0 in the cache they share
  (`env_cfg.cache_dir`), then found by the others."""
  def find() -> str:
    return tokenizer_dir(model_cfg, env_cfg.name, cache_dir(env_cfg.cache_dir), seed=seed)
  if distributed.is_primary():
    find()
  distributed.barrier("tokenizer")
  return find()


def load_tokenizer(directory: str):
  """The policy's tokenizer from `tokenizer_dir`'s answer."""
  from transformers import AutoTokenizer
  return AutoTokenizer.from_pretrained(directory)


def tokenizer_dir(model_cfg, env_name: str, cache_dir: str, seed: int = 0) -> str:
  """Where the policy's tokenizer files live (copied into HF exports): the checkpoint's own, or
  toolworld's BPE (plus one token per door for doors), built in `cache_dir` if needed."""
  if model_cfg.hf_checkpoint:
    return model_cfg.hf_checkpoint
  build = environments.get(env_name).tokenizer
  if build is None:
    raise ValueError(f"model.hf_checkpoint: required for env={env_name} (tokenizers are built "
                     f"for {' and '.join(environments.names('tokenizer'))} only)")
  return build(cache_dir, seed)


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
