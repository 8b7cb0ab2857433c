"""Tasks and tokenizers by environment name (toolworld, ToolHop, FTRL, BFCL multi-turn).

toolworld draws fresh worlds per query from a seed, with disjoint train and eval splits. The
real datasets ship one file each; they are split deterministically by task id (a hash, one in
`EVAL_SHARE`), and their dataset-supplied tool code runs in one shared sandbox.
"""

from __future__ import annotations

import hashlib
import os
from typing import Optional

from tirjax.env.tools import Task
from tirjax.env.toolworld import Difficulty, build_tokenizer, make_tasks

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

  def tasks(self, split: str, n: int) -> list[Task]:
    """The first `n` tasks of `split` (a fixed list: iterate over it with a data position)."""
    if self.name == "toolworld":
      cfg = self._cfg
      difficulty = Difficulty(hop_weights=tuple(cfg.hop_weights), p_parallel=cfg.p_parallel,
                              p_down=cfg.p_down)
      return make_tasks(split, n, seed=self._seed, difficulty=difficulty)
    if split not in self._cache:
      every = self._load_all()
      self._cache = {s: [t for t in every if _split_of(t.task_id) == s] for s in ("train", "eval")}
    tasks = self._cache[split]
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

  def close(self) -> None:
    if self._sandbox is not None:
      self._sandbox.close()


def cache_dir() -> str:
  """Where built artefacts (toolworld's tokenizer) are cached: $TIRJAX_CACHE or
  ~/.cache/tirjax. A build records its inputs, so a cached one is reused only when equal."""
  return os.environ.get("TIRJAX_CACHE") or os.path.join(os.path.expanduser("~"), ".cache",
                                                         "tirjax")


def load_tokenizer(model_cfg, env_name: str, cache_dir: str, seed: int = 0):
  """The policy's tokenizer: the checkpoint's own, or toolworld's BPE for the tiny model."""
  from transformers import AutoTokenizer
  if model_cfg.hf_checkpoint:
    return AutoTokenizer.from_pretrained(model_cfg.hf_checkpoint)
  if env_name != "toolworld":
    raise ValueError(f"model.hf_checkpoint: required for env={env_name} (the toolworld tokenizer "
                     "only covers toolworld)")
  return AutoTokenizer.from_pretrained(str(build_tokenizer(cache_dir, seed=seed)))


def tokenizer_dir(model_cfg, cache_dir: str, seed: int = 0) -> Optional[str]:
  """Where the tokenizer files live (copied into HF exports)."""
  return model_cfg.hf_checkpoint or str(build_tokenizer(cache_dir, seed=seed))
