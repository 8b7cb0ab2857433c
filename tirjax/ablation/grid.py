"""An ablation grid as a list of trainer runs, checked before any compute.

A grid config (`configs/ablate.py`) names cells by label, `estimator[/key=value,...]`, as the
credit bench does (e.g. "portool/fork_scale=none", "portool/rollout.mode=independent"). A key
whose first part is a top-level config entry (`rollout`, `loss`, `sft`, ...) is a dotted config
key; any other key is an option of the estimator (`advantage.options.<key>`). Values are read
as JSON where they parse (0, 0.5, true) and as strings otherwise.

Grid config entries:
  preset     the preset argument of every estimator's config file ("model=tiny,env=toolworld")
  configs    {estimator: "path.py" or "path.py:arg"}: another config file (and argument) for an
             estimator; the default ("" or absent) is configs/<estimator>.py with `preset`,
             or, for an estimator without a file of its own, configs/estimator.py with
             `<estimator>,<preset>` (its registration's protocol)
  overrides  nested config values set in every run (e.g. overrides.train.steps = 100)
  rl_overrides  nested config values set in every RL run but not in the warm starts: the RL
             design (group size, queries per step), never a key that decides a warm start, so
             grids that differ only here have the same warm-start runs and one can start from
             the other's (copy its `sft-<hash>` directories into the new workdir)
  cells      the cell labels
  seeds      the seeds; every cell runs once per seed (config key `seed`)
  warm_start "per_seed": SFT runs once per seed (and per group of cells whose SFT would be the same:
             same model, env, sft section and SFT-relevant rollout keys, `WARM_START_KEYS`), as
             a run with train.steps = 0 labelled "sft-<hash of those values>"; the RL cells then
             start from its HF export (model.hf_checkpoint) with sft.steps = 0.
             "shared": as "per_seed", but SFT runs at the first seed only and every seed's RL
             starts from it (the seeds then vary RL alone, as when papers compare estimators
             from one SFT checkpoint). "none": every run does its own SFT.
  compilation_cache  share JAX's persistent compilation cache (<workdir>/jax_cache) across runs
  report     {baseline, last_rl, title} of the final report

A run's config is a `Recipe` (config file, argument, dotted overrides), kept in its cell.json;
the process that trains it rebuilds the config from there (`configs/cell.py`). Run directories
are `<workdir>/<label>/seed<k>` (the estimator's name leads every label, so they never clash
with the warm starts' `sft-<hash>`, `report/` or `jax_cache/`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from typing import Any, Callable, Mapping, Optional

import ml_collections

from tirjax import advantages, rundir
from tirjax.advantages.labels import split_label
from tirjax.trainer import resolve, sections

# Config keys (and sections) that determine the weights SFT produces; cells that agree on all
# of them share a warm start. `seed` is shared per seed by construction.
WARM_START_KEYS = ("model.", "env.", "sft.", "rollout.answer_protocol", "rollout.shapes.max_tokens")
GRID_KEYS = ("preset", "configs", "overrides", "rl_overrides", "cells", "seeds", "warm_start",
             "compilation_cache", "report")
WARM_STARTS = ("per_seed", "shared", "none")
REPORT_DIR = "report"
GENERIC_CONFIG = "configs/estimator.py"  # any registered estimator, from its registration
_COMPONENT = re.compile(r"[A-Za-z0-9_.=,+\-]+")


class GridError(ValueError):
  """A bad grid config; the message names the entry (e.g. "cells[2] 'nosuch'")."""


@dataclasses.dataclass(frozen=True)
class Recipe:
  """How to build one run's config: a config file, its preset argument, dotted overrides
  applied in order. Values are JSON-normalised, so the recipe round-trips through cell.json."""

  config_file: str
  arg: str
  overrides: tuple[tuple[str, Any], ...]

  def to_json(self) -> dict:
    return {"config_file": self.config_file, "arg": self.arg,
            "overrides": [[k, v] for k, v in self.overrides]}

  @classmethod
  def from_json(cls, d: Mapping[str, Any]) -> "Recipe":
    return cls(d["config_file"], d["arg"], tuple((k, v) for k, v in d["overrides"]))


@dataclasses.dataclass(frozen=True)
class Job:
  """One trainer run of the grid: a cell (or a warm start) at one seed."""

  label: str
  estimator: str  # "sft" for a warm start
  options: dict  # the cell's overrides as written in its label
  seed: int
  workdir: str
  recipe: Recipe
  needs: Optional[str] = None  # workdir of the warm start that must finish first

  @property
  def name(self) -> str:
    return f"{self.label} seed{self.seed}"

  def cell_json(self) -> dict:
    out = {"label": self.label, "estimator": self.estimator, "options": self.options,
           "seed": self.seed, "recipe": self.recipe.to_json()}
    if self.needs:  # the warm start's evaluation is the run's baseline (gain/accuracy)
      out["warm_start"] = os.path.abspath(self.needs)
    return out


config_module = sections.config_module  # the config file at a path, as a module


def build_config(recipe: Recipe) -> ml_collections.ConfigDict:
  """The locked config of `recipe`: `get_config(arg)` of its file, then its overrides
  (`--print_config` names the file as the protocol's source and the overrides as the cell's)."""
  config = config_module(recipe.config_file).get_config(recipe.arg or None)
  sections.note_config_file(config, os.path.relpath(recipe.config_file))
  for key, value in recipe.overrides:
    assign(config, key, value)
  return config


def assign(config: ml_collections.ConfigDict, key: str, value: Any) -> None:
  """Sets the dotted `key` of a locked config (`update_from_flattened_dict`); an unknown key,
  a whole section or a value of the wrong type raises `KeyError` / `TypeError` naming the key."""
  parent, _, leaf = key.rpartition(".")
  section = config
  for part in parent.split(".") if parent else ():
    found = isinstance(section, ml_collections.ConfigDict) and part in section
    section = section[part] if found else None
  if not isinstance(section, ml_collections.ConfigDict) or leaf not in section:
    valid = sorted(section.keys()) if isinstance(section, ml_collections.ConfigDict) else []
    raise KeyError(f"unknown config key '{key}' ({parent or 'the config'} has no '{leaf}'; "
                   f"valid: {valid})")
  if isinstance(section[leaf], ml_collections.ConfigDict):
    raise KeyError(f"'{key}' is a config section; set one of its keys "
                   f"{sorted(section[leaf].keys())}")
  try:
    config.update_from_flattened_dict({key: value})
  except (TypeError, ValueError) as e:
    raise TypeError(f"{key}={value!r}: {e}") from None


def parse_label(label: str, sections) -> tuple[str, dict, list[tuple[str, Any]]]:
  """`estimator[/key=value,...]` (`advantages.labels.split_label`) → (estimator,
  {key as written: value}, [(config key, value)]): a key outside `sections` is an estimator
  option (`advantage.options.<key>`)."""
  try:
    name, options = split_label(label)
  except ValueError as e:
    raise GridError(str(e)) from None
  overrides = [(key if key.split(".")[0] in sections else f"advantage.options.{key}", value)
               for key, value in options.items()]
  return name, options, overrides


def _json_normal(value, where: str):
  try:
    return json.loads(json.dumps(value))
  except (TypeError, ValueError):
    raise GridError(f"{where}: {value!r} is not a JSON value") from None


def _config_spec(grid, estimator: str, where: str) -> tuple[str, str]:
  """(absolute config file, argument) of an estimator's cells."""
  spec = grid.configs.get(estimator)
  path, arg = (spec.split(":", 1) + [None])[:2] if spec else (f"configs/{estimator}.py", None)
  if not spec and not os.path.isfile(path):  # no file of its own: the generic path
    path, arg = GENERIC_CONFIG, ",".join(filter(None, (estimator, grid.preset)))
  path = os.path.abspath(path)
  if not os.path.isfile(path):
    raise GridError(f"{f'configs.{estimator}' if spec else where}: config file {path} not found "
                    "(relative paths are read from the current directory)")
  return path, grid.preset if arg is None else arg


def _seeds(grid) -> list[int]:
  seeds = list(grid.seeds)
  if not seeds or any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in seeds):
    raise GridError(f"seeds: need a non-empty list of integers >= 0, got {grid.seeds!r}")
  if len(set(seeds)) != len(seeds):
    raise GridError(f"seeds: {seeds} repeats a seed")
  return seeds


def _check_label(label: str, where: str) -> None:
  parts = label.split("/")
  if any(p in (".", "..") or not _COMPONENT.fullmatch(p) for p in parts):
    raise GridError(f"{where}: the label must be a relative path of letters, digits and "
                    "_.=,+- (it names the run directory)")


# Keys that enter a warm start's label under the names they had when warm starts were first
# labelled (issue 29 renamed them), so that every existing grid's warm start keeps its label.
_SIGNATURE_NAMES = {"step.num_microbatches": "train.micro_batches",
                    "step.logprob_chunk_size": "model.logprob_chunk",
                    "step.log_entropy": "train.log_entropy",
                    "sft.demos.p_recover": "sft.p_recover", "sft.demos.p_detour": "sft.p_detour",
                    "sft.demos.p_reorder": "sft.p_reorder",
                    "sft.demos.p_confuse": "sft.p_confuse",
                    # toolworld's own section since issue 39 (the labels of before kept)
                    **{f"env.toolworld.{k}": f"env.{k}" for k in (
                        "hop_weights", "p_parallel", "p_down", "p_direction",
                        "chain_directions")}}
# Keys added after warm starts were made, left out of the label at their default, so that the
# labels (and the warm starts on disk) of every grid from before stay what they were.
_UNSIGNED_DEFAULTS = {"env.toolworld.chain_family": "", "sft.max_tokens_per_microbatch": 1024}


def _signature(config) -> str:
  """The warm-start label of a cell: a hash of its SFT-relevant values."""
  flat = rundir.flatten(json.loads(json.dumps(resolve.config_record(config))))
  flat = {_SIGNATURE_NAMES.get(k, k): v for k, v in flat.items()
          if k not in _UNSIGNED_DEFAULTS or v != _UNSIGNED_DEFAULTS[k]}
  kept = {k: v for k, v in sorted(flat.items()) if _warm_start_key(k)}
  return "sft-" + hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:8]


def _resolve(config, where: str) -> None:
  try:
    resolve.resolve(config)
  except (resolve.ConfigError, ValueError, TypeError, KeyError) as e:
    raise GridError(f"{where}: {e}") from None


def _apply(config, overrides, where: Callable[[str], str]) -> None:
  for key, value in overrides:
    try:
      assign(config, key, value)
    except (KeyError, TypeError) as e:
      raise GridError(f"{where(key)}: {e.args[0]}") from None


def _warm_start_key(key: str) -> bool:
  return any(key == p or key.startswith(p) for p in WARM_START_KEYS)


def plan(grid: ml_collections.ConfigDict, workdir: str) -> list[Job]:
  """Every run of the grid, warm starts first within each seed; checks every config.

  Raises:
    GridError: naming the bad entry (unknown estimator, option or key; a value the trainer
      rejects; duplicate labels; bad seeds), before anything is written.
  """
  if set(grid.keys()) != set(GRID_KEYS):
    raise GridError(f"grid: expected the entries {list(GRID_KEYS)}, got {sorted(grid.keys())}")
  for name in grid.configs.keys():
    if name not in advantages.names():
      raise GridError(f"configs.{name}: unknown estimator; registered: {advantages.names()}")
  seeds = _seeds(grid)
  shared = []
  for key, value in rundir.flatten(grid.overrides.to_dict()).items():
    if key == "seed":
      raise GridError("overrides.seed: seeds are set by the grid's `seeds`")
    shared.append((key, _json_normal(value, f"overrides.{key}")))
  rl = []
  for key, value in rundir.flatten(grid.rl_overrides.to_dict()).items():
    if key == "seed" or _warm_start_key(key):
      raise GridError(f"rl_overrides.{key}: a key that decides the warm start (or the seed); "
                      "set it in `overrides`")
    rl.append((key, _json_normal(value, f"rl_overrides.{key}")))
  if not grid.cells:
    raise GridError("cells: the grid has no cells")
  if grid.warm_start not in WARM_STARTS:
    raise GridError(f"warm_start: must be one of {WARM_STARTS}, got {grid.warm_start!r}")

  cells = []  # (label, estimator, options, recipe without seed, warm-start label or None)
  groups: dict[str, Recipe] = {}  # warm-start label -> its recipe (without seed)
  seen: dict[str, int] = {}
  for i, label in enumerate(grid.cells):
    if not isinstance(label, str):
      raise GridError(f"cells[{i}]: expected a label 'estimator[/key=value,...]', got {label!r}")
    where = f"cells[{i}] '{label}'"
    if label in seen:
      raise GridError(f"{where}: the same label as cells[{seen[label]}]")
    seen[label] = i
    _check_label(label, where)
    name = label.partition("/")[0].strip()
    if name not in advantages.names():
      raise GridError(f"{where}: unknown estimator '{name}'; registered: {advantages.names()}")
    path, arg = _config_spec(grid, name, where)
    config = build_config(Recipe(path, arg, ()))
    if config.advantage.name != name:
      raise GridError(f"{where}: config file {path} builds estimator '{config.advantage.name}'")
    try:
      _, options, own = parse_label(label, set(config.keys()))
    except GridError as e:
      raise GridError(f"{where}: {e}") from None
    if any(key == "seed" for key, _ in own):
      raise GridError(f"{where}: seeds are set by the grid's `seeds`")
    _apply(config, shared, lambda key: f"overrides.{key} (in {where})")
    _apply(config, rl, lambda key: f"rl_overrides.{key} (in {where})")
    _apply(config, own, lambda key: where)
    _resolve(config, where)
    recipe = Recipe(path, arg, tuple(shared + rl + own))
    warm = None
    if grid.warm_start != "none" and config.sft.steps > 0:
      warm = _signature(config)
      if warm not in groups:
        groups[warm] = Recipe(path, arg, tuple(shared) + tuple(
            (k, v) for k, v in own if _warm_start_key(k)))
        warm_config = build_config(groups[warm])
        assign(warm_config, "train.steps", 0)
        _resolve(warm_config, f"warm start {warm} (first needed by {where})")
    cells.append((label, name, options, recipe, warm))

  jobs = []
  for seed in seeds:
    sft_seed = seeds[0] if grid.warm_start == "shared" else seed
    for warm, recipe in groups.items() if seed == sft_seed else ():
      jobs.append(Job(warm, "sft", {}, seed, os.path.join(workdir, warm, f"seed{seed}"),
                      _with(recipe, ("seed", seed), ("train.steps", 0),
                            ("train.export_final", True))))
    for label, name, options, recipe, warm in cells:
      if warm is None:
        jobs.append(Job(label, name, options, seed, os.path.join(workdir, label, f"seed{seed}"),
                        _with(recipe, ("seed", seed))))
        continue
      warm_dir = os.path.join(workdir, warm, f"seed{sft_seed}")
      export = os.path.join(os.path.abspath(warm_dir), rundir.HF_EXPORT)
      jobs.append(Job(label, name, options, seed, os.path.join(workdir, label, f"seed{seed}"),
                      _with(recipe, ("seed", seed), ("model.hf_checkpoint", export),
                            ("sft.steps", 0)), needs=warm_dir))
  return jobs


def _with(recipe: Recipe, *overrides) -> Recipe:
  return dataclasses.replace(recipe, overrides=recipe.overrides + tuple(overrides))
