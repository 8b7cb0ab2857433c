"""The experiment config: every section, the presets, `make`, and where each value came from.

This module is the one place a config is assembled. A config has a `seed` and the sections of
`SECTIONS`, each the fields of one options dataclass under their own names (but the fields
`resolve` derives from other sections, `DERIVED`), plus each environment's own section
`env.<name>` (`env_sections`). `make` builds it in layers, the same layers `provenance` names:

  default          the options' dataclass defaults (and `BASE`, the experiment's own)
  protocol         the estimator config's paper protocol (`configs/<estimator>.py`)
  preset argument  `model=`, `env=`, `sampler=`, `mesh=`, `rollout=`, `steps=`, `smoke=`
  preset <name>    each named preset the argument implies, in order (`presets`): `cpu_scale`
                   (the tiny model), the running environment's own (`Environment.presets` on
                   its registry entry: toolworld's `toolworld_headroom`, `bfcl`, `doors`),
                   then `smoke`; a named preset never overrides a key the argument sets

A preset is data (`tirjax.config.Preset`: its values and when it applies), applied one way
(`tirjax.config.apply_preset`) by `make` and by `provenance`, which rebuilds the config after
each layer from the record `make` keeps of its inputs (`made`). `--print_config` prints every
key with its value, the layer that set it and its description: the first sentence of the
comment on its options field (`tirjax.config.field_docs`). `resolve` turns the sections back
into their dataclasses and checks what spans sections.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import re
from typing import Any, Callable, Optional

import ml_collections

from tirjax import advantages, distributed, option_checks, rundir, sharding
from tirjax.config import (UNCHANGED, Preset, Ref, apply_preset, config_from_dataclass,
                           dataclass_from_config, field_docs, parse_preset_arg)
from tirjax.env import environments
from tirjax.episodes.options import MODES, RolloutOptions
from tirjax.loss import LossOptions
from tirjax.models.config import PRESETS as MODEL_PRESETS
from tirjax.train_steps.optimizer import OptimizerOptions
from tirjax.train_steps.step import StepOptions
from tirjax.trainer import shape_needs
# The experiment's own sections' options (re-exported: `sections.TrainOptions`, ...).
from tirjax.trainer.options import (JUDGES, MAX_TASKS, SAMPLERS, CriticOptions,  # noqa: F401
                                    EnvOptions, JudgeOptions, ModelOptions, SamplerOptions, SFTOptions,
                                    TrainOptions)


@dataclasses.dataclass(frozen=True)
class AdvantageSection:
  """The `advantage` section: which estimator, and its options."""

  name: str = "grpo"  # the advantage estimator, by its registered name (`tirjax.advantages`)
  # The estimator's own options (its registration's options class; `resolve` builds them).
  options: Any = None


# Every section of the config, in the order of its keys, with the options dataclass it holds.
SECTIONS = {"model": ModelOptions, "env": EnvOptions, "judge": JudgeOptions,
            "sampler": SamplerOptions, "train": TrainOptions, "step": StepOptions,
            "sft": SFTOptions, "rollout": RolloutOptions, "advantage": AdvantageSection,
            "loss": LossOptions, "optim": OptimizerOptions, "critic": CriticOptions,
            "sharding": sharding.ShardingOptions, "distributed": distributed.DistributedOptions}
# Fields that `resolve` derives from other sections (rules that span sections), so they are no
# config keys: the step's temperature from train.tempered_policy and rollout.temperature; the
# demonstrations' answer protocol from rollout.answer_protocol; SFT's step from the `step`
# section (at temperature 1, no entropy metric); the rollouts' seed from the run's `seed` (the
# trainer draws every selection from one Generator of it); the environment's own options from
# its section `env.<name>` (`env_sections`).
DERIVED = {"step": ("temperature",), "sft": ("step", "demos.answer_protocol"),
           "rollout": ("seed", "logprob_temperature"), "env": ("options",)}
# The experiment's own defaults where they differ from the options': RL's update and log-prob
# passes forward each query group once, as a packed forest, and SFT each batch of
# demonstrations: the padded path's loss and gradients (issue 38; tests/test_packed_update.py,
# tests/test_packed_sft.py), faster as benchmarks/results/bench_update_cpu.json measures.
BASE = {"step.packed": True}
SEED_DOC = "the run's seed: every draw of tasks, rollouts and initial weights follows it"


def env_sections() -> dict[str, type]:
  """{name: options class} of the environments with options of their own: each is the config
  section `env.<name>`, present whichever environment runs (as `rollout.tree` is in every
  rollout mode), read by `resolve` for the one that does."""
  return {n: environments.get(n).options for n in environments.names("options")}


# -- Presets ----------------------------------------------------------------------------------

PRESET_KEYS = {"model": tuple(MODEL_PRESETS), "env": tuple(environments.names()),
               "sampler": SAMPLERS, "mesh": None, "rollout": MODES, "steps": None, "smoke": ("1",)}
# The tiny policy's sizes (`tirjax.models.config.tiny` with these changes). Measured on 2 CPU
# cores: d=128 with head size 32 reaches an SFT loss of 0.84 in 300 steps (192 s) where the
# d=64 / head size 16 default needs ~470 steps (~245 s); 4 layers were slower per second.
TINY_SIZES = dict(hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=32)


def _has_demonstrations(c) -> bool:
  return environments.get(c.env.name).demonstrations is not None


def _on_built_in(value):
  """A shape for toolworld's tasks, on an environment with demonstrations (built in)."""
  return lambda c: value if _has_demonstrations(c) else UNCHANGED


def _if_sft(value):
  return lambda c: value if c.sft.steps else UNCHANGED


CPU_SCALE = Preset("cpu_scale", when={"model": "tiny"}, doc="""\
The tiny model on short episodes: sizes, steps and learning rates that fit a 2-core CPU
(toolworld's RL design is its entry's `toolworld_headroom`). On the built-in environments,
shapes made for toolworld's tasks (prompts of at most 146 tokens, 5 ground-truth calls of at
most 3 arguments, 4 tool steps and the answer); on the datasets, shapes sized from their
tasks.""", values={
    "train.steps": 40,
    "model.tiny": TINY_SIZES,
    "step.logprob_chunk_size": 256,
    "env.eval_tasks": 256,
    "sft.steps": 800,
    "sft.optim.learning_rate": 1e-2,
    "sft.optim.warmup_steps": 20,
    "sft.optim.schedule": "cosine",
    "sft.optim.decay_steps": Ref("sft.steps"),
    "sft.optim.final_lr_fraction": 0.05,
    "optim.learning_rate": 3e-4,
    "optim.weight_decay": 0.0,
    # the critic (ppo, turn_ppo) at the policy's tiny-model rate
    "critic.optim.learning_rate": 3e-4,
    "critic.optim.weight_decay": 0.0,
    "train.queries_per_step": 3,
    "train.mini_batch_queries": 0,
    "train.eval_every": 0,  # evaluated after SFT and after the last RL step only
    "rollout.max_steps": 6,  # toolworld needs at most 4 tool steps and the answer
    "rollout.shapes.max_steps": Ref("rollout.max_steps"),
    "rollout.max_new_tokens": 64,
    "rollout.shapes.max_tokens": _on_built_in(512),
    "rollout.shapes.max_gt_calls": _on_built_in(8),
    "rollout.shapes.max_params": _on_built_in(4)})

SMOKE = Preset("smoke", when={"smoke": "1"}, doc="""\
`smoke=1`: every stage of the run (SFT if it has one, RL, evaluation, export) for a few steps
on a few tasks, episodes of at most 2 short steps, to check that a command runs, not what it
learns. On a dataset the context is sized from those few tasks ("auto").""", values={
    "train.steps": 2,
    "sft.steps": _if_sft(2), "sft.batch_size": _if_sft(2), "sft.num_demos": _if_sft(8),
    "env.train_tasks": 8, "env.eval_tasks": 2,
    "train.queries_per_step": 2, "train.mini_batch_queries": 1, "train.eval_every": 0,
    "train.checkpoint_every": 1,
    "rollout.n": 2, "rollout.max_steps": lambda c: min(c.rollout.max_steps, 2),
    "rollout.max_new_tokens": 16,
    "rollout.arpo.initial_rollouts": 2, "rollout.arpo.total_rollouts": 3,
    "rollout.shapes.max_tokens": lambda c: (UNCHANGED if _has_demonstrations(c)
                                            else shape_needs.AUTO)})


def presets(settings: dict[str, str]) -> list[Preset]:
  """The named presets that `settings` (the preset argument's values, defaults included)
  implies, in the order they apply: `cpu_scale`, the environment's own, `smoke`."""
  return [p for p in (CPU_SCALE, *environments.get(settings["env"]).presets, SMOKE)
          if p.applies(settings)]


# -- make -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Made:
  """What `make` built a config from: enough to build it again after any of its layers."""

  estimator: str
  protocol: dict
  arg: Optional[str]
  config_file: Optional[str] = None  # the estimator config's file, where a caller said


def make(arg: str | None, *, estimator: str, rollout: dict | None = None,
         loss: dict | None = None, optim: dict | None = None,
         advantage: dict | None = None, train: dict | None = None) -> ml_collections.ConfigDict:
  """The locked config of `estimator` with its paper's protocol (the sections `rollout`,
  `loss`, `optim`, `advantage` (its options) and `train`), then the presets in `arg`."""
  protocol = {k: v for k, v in dict(rollout=rollout, loss=loss, optim=optim,
                                    advantage=advantage, train=train).items() if v}
  recipe = Made(estimator, protocol, arg)
  c = build(recipe)
  c.lock()
  object.__setattr__(c, "_tirjax_made", recipe)  # not a key: `made` reads it
  return c


def made(config: ml_collections.ConfigDict) -> Optional[Made]:
  """The inputs `make` built `config` from, or None for a config `make` did not build."""
  return getattr(config, "_tirjax_made", None)


def note_config_file(config: ml_collections.ConfigDict, path: str) -> None:
  """Records that `config` came from the estimator config at `path` (an ablation cell's
  recipe names it), so that `provenance` names that file as the protocol's source."""
  if made(config) is not None:
    object.__setattr__(config, "_tirjax_made",
                       dataclasses.replace(made(config), config_file=path))


def layer_names(recipe: Made) -> list[str]:
  return ["default", "protocol", "preset argument"] + [
      f"preset {p.name}" for p in presets(_settings(recipe))]


def build(recipe: Made, layers: Optional[int] = None) -> ml_collections.ConfigDict:
  """The (unlocked) config of `recipe` after its first `layers` layers (`layer_names`; None:
  all of them)."""
  layers = len(layer_names(recipe)) if layers is None else layers
  c = _sections(recipe.estimator, recipe.protocol if layers > 1 else {})
  pinned = _apply_argument(c, parse_preset_arg(recipe.arg, PRESET_KEYS)) if layers > 2 else ()
  # Rows per batch follow the queries per step and the rows per query (a live reference).
  per_query = (c.rollout.arpo.get_ref("total_rollouts") if c.rollout.mode == "arpo"
               else c.rollout.get_ref("n"))
  c.rollout.shapes.num_rows = c.train.get_ref("queries_per_step") * per_query
  for preset in presets(_settings(recipe))[:max(0, layers - 3)]:
    apply_preset(c, preset, pinned)
  return c


def _settings(recipe: Made) -> dict[str, str]:
  given = parse_preset_arg(recipe.arg, PRESET_KEYS)
  return {"model": given.get("model", ModelOptions.preset),
          "env": given.get("env", EnvOptions.name), "smoke": given.get("smoke", "")}


def _sections(estimator: str, protocol: dict) -> ml_collections.ConfigDict:
  """Every section from its options' defaults, those of `protocol` with its values."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  for name, options in SECTIONS.items():
    if name == "advantage":
      c.advantage = ml_collections.ConfigDict(dict(name=estimator, options=config_from_dataclass(
          advantages.get(estimator).make_options(protocol.get("advantage", {})))))
      continue
    if name in protocol:
      options = dataclass_from_config(options, protocol[name], name)
    c[name] = config_from_dataclass(options, omit=DERIVED.get(name, ()))
  for name, options in env_sections().items():
    c.env[name] = config_from_dataclass(options)
  for key, value in BASE.items():
    c[key.split(".")[0]][key.split(".")[1]] = value
  # The shapes that may be sized from the data (`shape_needs.SIZED`): "auto" unless the
  # protocol gives them; each takes a number or "auto" (`--config.rollout.shapes.max_tokens=
  # 8192` too), so their field accepts either.
  given = protocol.get("rollout", {}).get("shapes", {})
  for key in shape_needs.SIZED:
    del c.rollout.shapes[key]
    c.rollout.shapes[key] = ml_collections.FieldReference(given.get(key, shape_needs.AUTO),
                                                          field_type=object)
  return c


def _apply_argument(c: ml_collections.ConfigDict, given: dict[str, str]) -> tuple[str, ...]:
  """Sets the keys the preset argument names; returns them (no named preset overrides them)."""
  values = {}
  if "model" in given:
    values["model.preset"] = given["model"]
  if "env" in given:
    values.update({"env.name": given["env"],
                   "env.data_path": environments.get(given["env"]).data_path})
  if "sampler" in given:
    values["sampler.kind"] = given["sampler"]
  if "steps" in given:
    values["train.steps"] = _parse_steps(given["steps"])
  if "rollout" in given:
    values["rollout.mode"] = given["rollout"]
  if "mesh" in given:
    values["sharding.mesh"] = _parse_mesh(given["mesh"])
  apply_preset(c, Preset("preset argument", "", values))
  return tuple(values)


def _parse_steps(text: str) -> int:
  try:
    return int(text)
  except ValueError:
    raise ValueError(f"steps={text}: the preset 'steps' must be an integer (RL steps, e.g. "
                     "steps=40)") from None


def _parse_mesh(text: str) -> tuple:
  sizes = text.split("x")
  if len(sizes) != 3:
    raise ValueError(f"mesh={text}: expected DATAxFSDPxTENSOR, e.g. mesh=-1x2x1")
  try:
    return tuple(zip(("data", "fsdp", "tensor"), (int(s) for s in sizes)))
  except ValueError:
    raise ValueError(f"mesh={text}: sizes must be integers (-1 = the remaining devices)") from None


# -- Provenance and descriptions --------------------------------------------------------------


def _flat(c: ml_collections.ConfigDict) -> dict[str, Any]:
  return rundir.flatten(c.to_dict())


def provenance(get_config: Callable, config_file: str, arg: str | None,
               final: ml_collections.ConfigDict) -> list[tuple[str, Any, str]]:
  """Each key of `final` (`get_config(arg)` of `config_file`, then the command line) as
  (key, value, source), sorted by key. The source is the last layer that changed the value:
  `make`'s layers (`layer_names`; "protocol" named by the estimator's config file), then
  `config_file` (what `get_config` changed after `make`: dapo's live references, an ablation
  cell's recipe) and "command line"."""
  built = get_config(arg)
  recipe = made(built)
  layers = []
  if recipe is not None:
    for i, name in enumerate(layer_names(recipe)):
      label = (recipe.config_file or config_file) if name == "protocol" else name
      layers.append((label, _flat(build(recipe, i + 1))))
  layers += [(config_file, _flat(built)), ("command line", _flat(final))]
  missing = object()
  out = []
  for key, value in sorted(layers[-1][1].items()):
    source, before = layers[0][0], missing
    for name, values in layers:
      now = values.get(key, missing)
      if now is not missing and (before is missing or now != before):
        source = name
      before = now
    out.append((key, value, source))
  return out


def describe(key: str, config: ml_collections.ConfigDict) -> str:
  """The one-line description of the config `key` (its options field's comment), with the
  values it may take where its field is typed `Literal[...]`; "" where there is none."""
  if key == "seed":
    return SEED_DOC
  head, *rest = key.split(".")
  if head not in SECTIONS:  # not an experiment's key (an ablation grid's)
    return ""
  cls = SECTIONS[head]
  if head == "env" and rest and rest[0] in env_sections():
    cls, rest = env_sections()[rest[0]], rest[1:]
  elif head == "advantage" and rest[:1] == ["options"]:
    cls, rest = advantages.get(config.advantage.name).options, rest[1:]
  for i, part in enumerate(rest):
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if part not in fields:
      return ""
    default = getattr(cls(), part) if i + 1 < len(rest) else None
    if i + 1 < len(rest) and dataclasses.is_dataclass(default):
      cls = type(default)
      continue
    doc = field_docs(cls).get(part, "")
    if i + 1 < len(rest):  # inside a mapping field (model.tiny.<key>)
      return f"{doc} ({'.'.join(rest[i + 1:])})"
    allowed = option_checks.choices_of(cls).get(part)
    return f"{doc} (one of {' | '.join(map(repr, allowed))})" if allowed else doc
  return ""


@functools.cache
def config_module(path: str):
  """The config file at `path` as a module (its `get_config`), loaded once."""
  spec = importlib.util.spec_from_file_location(
      "tirjax_config_file_" + re.sub(r"\W", "_", path), path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def provenance_text(config_spec: str, final: ml_collections.ConfigDict) -> str:
  """`provenance` of `config_spec` ("<config file>[:<arg>]", as `--config` takes it) whose
  final config is `final`: one `key = value  # source: description` line per key
  (`--print_config`). Works for every config file, an ablation cell's included."""
  config_file, _, arg = config_spec.partition(":")
  get_config = config_module(config_file).get_config
  lines = []
  for key, value, source in provenance(get_config, config_file, arg or None, final):
    doc = describe(key, final)
    lines.append(f"{key} = {value!r}  # {source}" + (f": {doc}" if doc else ""))
  return "\n".join(lines)
