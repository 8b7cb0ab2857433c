"""From a locked experiment config to checked option objects, before any compute.

Every section becomes the frozen options dataclass it holds (whose `__post_init__` rejects
bad values): the experiment's own sections and the train step's (`options.py`: model, env,
judge, sampler, train, step, sft) and the options of the components that use the others.
`resolve` is one pass over them plus what spans sections: the values derived from other
sections (`sections.DERIVED`) and the rules that check one section against another. Every error names the config key: `ConfigError("rollout.shapes.num_rows: ...")`.

The rollout shapes set to "auto" (`shape_needs.AUTO`) are sized from the data the run will use:
`resolve` gives them their value for no task (`Experiment.auto_shapes` names them) and
`fit_to_data` sizes them from the tasks' needs, checking the shapes set to numbers against the
same needs; `tirjax.trainer.prepare.experiment` does both, reading the data.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import jax

from tirjax import advantages, distributed, sharding
from tirjax.config import dataclass_from_config
from tirjax.env import environments
from tirjax.loss import LossOptions
from tirjax.loss import aggregation as aggregation_modes
from tirjax.models import config as model_config
from tirjax.episodes.options import RolloutOptions
from tirjax.sampling.vllm import TINY_HEAD_DIM
from tirjax.train_steps.optimizer import OptimizerOptions
from tirjax.train_steps.step import StepOptions

from tirjax.trainer import sections, shape_needs
from tirjax.trainer.sections import (JUDGES, MAX_TASKS, SAMPLERS, SECTIONS, CriticOptions,
                                     EnvOptions, JudgeOptions, ModelOptions, SamplerOptions,
                                     SFTOptions, TrainOptions)

__all__ = ["ConfigError", "Experiment", "resolve", "config_record", "fit_to_mesh", "fit_to_data",
           "SAMPLERS", "JUDGES", "MAX_TASKS"]


class ConfigError(ValueError):
  """An invalid experiment config; the message starts with the offending key."""


@dataclasses.dataclass(frozen=True)
class Experiment:
  """The checked options of one run (see `resolve`): one field per config section."""

  seed: int
  model: ModelOptions
  env: EnvOptions
  judge: JudgeOptions
  sampler: SamplerOptions
  train: TrainOptions
  step: StepOptions  # RL's train step; SFT's is `sft.step`
  sft: SFTOptions
  estimator: advantages.Estimator
  advantage: Any  # the estimator's options dataclass
  rollout: RolloutOptions
  loss: LossOptions
  optim: OptimizerOptions
  sharding: sharding.ShardingOptions
  distributed: distributed.DistributedOptions
  # the value model's options, its aggregation resolved ("" → the loss's); read only when the
  # estimator reads values (`has_critic`)
  critic: CriticOptions = CriticOptions()
  # rollout.shapes keys set to "auto" and not yet sized from the data (`fit_to_data`): until
  # then they hold their value for no task (`shape_needs.floors`)
  auto_shapes: tuple[str, ...] = ()

  @property
  def advantage_filters_groups(self) -> bool:
    """The estimator masks whole groups (DAPO's dynamic sampling): the trainer refills them."""
    return bool(getattr(self.advantage, "dynamic_sampling", False))

  @property
  def has_critic(self) -> bool:
    """The estimator reads a critic's values (`needs=("values",)`): the run trains a value
    model beside the policy (`critic` section)."""
    return "values" in self.estimator.needs


def _section(cls, cfg, key: str):
  try:
    return dataclass_from_config(cls, cfg.to_dict() if hasattr(cfg, "to_dict") else cfg, key)
  except ValueError as e:
    raise ConfigError(str(e)) from None


def _own_section(name: str, values: dict, cls=None):
  """One of the sections of `sections.SECTIONS` (or `cls`) from its `values`; a bad value names
  its key as `section.key` (`sft.demos.p_confuse` in a subsection)."""
  try:
    return dataclass_from_config(cls or SECTIONS[name], values, name)
  except ValueError as e:
    raise ConfigError(re.sub(rf"^({re.escape(name)}(?:\.\w+)*): (\w[\w.]*): ", r"\1.\2: ",
                             str(e))) from None


def _env_section(values: dict):
  """`EnvOptions` from the `env` section, its `options` read from the running environment's
  own section `env.<name>` (`sections.env_sections`; the others are not read)."""
  values = dict(values)
  own = {n: values.pop(n) for n in sections.env_sections() if n in values}
  _need("options" not in values, "env.options", "is no key: an environment's own options are "
        "its section env.<name>")
  env = _own_section("env", values)
  cls = environments.get(env.name).options
  if cls is None:
    return env
  return dataclasses.replace(env, options=_own_section(f"env.{env.name}", own.get(env.name, {}),
                                                       cls))


def _need(ok: bool, key: str, problem: str) -> None:
  if not ok:
    raise ConfigError(f"{key}: {problem}")


def distributed_options(c) -> distributed.DistributedOptions:
  """The `distributed` section alone: read before anything touches JAX's devices (the
  trainer initialises the multi-process runtime from it first)."""
  return _section(distributed.DistributedOptions, c.distributed, "distributed")


def config_record(c) -> dict:
  """The config `c` as plain nested dicts: what the run directory records (config.json, the
  run's id, the loggers' config)."""
  return c.to_dict()


def resolve(c) -> Experiment:
  """Checks the whole config `c`; returns its option objects or raises `ConfigError`."""
  d = c.to_dict()
  seed = d["seed"]
  _need(isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0, "seed",
        f"must be an integer >= 0, got {seed!r}")
  model, judge, sampler, train = (_own_section(name, d[name])
                                  for name in ("model", "judge", "sampler", "train"))
  env = _env_section(d["env"])
  auto = _auto_shapes(d["rollout"])
  rollout = _section(RolloutOptions, {**d["rollout"], "seed": seed}, "rollout")
  try:
    estimator = advantages.get(d["advantage"]["name"])
  except KeyError as e:
    raise ConfigError(f"advantage.name: {e.args[0]}") from None
  advantage = _section(estimator.options, d["advantage"]["options"], "advantage.options")
  loss = _section(LossOptions, d["loss"], "loss")
  optim = _section(OptimizerOptions, d["optim"], "optim")
  shard = _section(sharding.ShardingOptions, d["sharding"], "sharding")
  dist = distributed_options(c)

  # -- Values derived from other sections (`sections.DERIVED`) --------------------------------
  _need(train.eval_subset <= env.eval_tasks, "train.eval_subset",
        f"{train.eval_subset} exceeds env.eval_tasks={env.eval_tasks} (it is a subset of them)")
  if train.tempered_policy:
    _need(rollout.temperature > 0, "train.tempered_policy",
          "needs a sampling temperature > 0 (rollout.temperature = 0 is greedy)")
  if loss.rollout_correction.enabled and train.tempered_policy:
    # the correction weighs π_old / π_sampler: both must be the tempered policy's
    _need(sampler.kind == "jax" or rollout.temperature == 1.0, "loss.rollout_correction",
          f"with train.tempered_policy and sampler.kind={sampler.kind} needs "
          f"rollout.temperature = 1, got {rollout.temperature}: vLLM reports the raw model's "
          "log-probs, the tempered π_old is another distribution's, and their ratio is not the "
          "sampler-trainer gap (the JAX sampler reports the tempered policy's)")
    rollout = dataclasses.replace(rollout, logprob_temperature=rollout.temperature)
  step = _own_section("step", {
      **d["step"], "temperature": rollout.temperature if train.tempered_policy else 1.0})
  sft = _own_section("sft", {
      **d["sft"],
      # Without SFT steps the SFT optimizer never runs: its defaults, unchecked (a cosine over
      # 0 steps is not an error then).
      "optim": d["sft"]["optim"] if d["sft"]["steps"] != 0 else {},
      "demos": {**d["sft"]["demos"], "answer_protocol": rollout.answer_protocol},
      # packed as RL's is (`step.packed`): demonstrations share their system prompt
      "step": dataclasses.replace(step, log_entropy=False, temperature=1.0)})
  sft = dataclasses.replace(sft, step=dataclasses.replace(  # its own budget, once checked
      sft.step, max_tokens_per_microbatch=sft.max_tokens_per_microbatch))

  # -- Rules that span sections ---------------------------------------------------------------
  environment = environments.get(env.name)
  if not model.hf_checkpoint:
    _need(model.preset == "tiny" and environment.tokenizer is not None, "model.hf_checkpoint",
          f"required for model.preset={model.preset!r} / env.name={env.name!r} (weights and "
          f"tokenizer); only the tiny model on {' or '.join(environments.names('tokenizer'))} "
          "trains from scratch")
    if model.tiny:
      try:  # the whole model config, as the trainer will build it (vocabulary aside)
        model_config.tiny(**model.tiny)
      except (TypeError, ValueError) as e:
        raise ConfigError(f"model.tiny.{e}") from None
      if sampler.kind == "vllm":
        _need(model.tiny.get("head_dim", TINY_HEAD_DIM) >= TINY_HEAD_DIM, "model.tiny.head_dim",
              f"vLLM's CPU attention needs a head size >= {TINY_HEAD_DIM}, got "
              f"{model.tiny.get('head_dim')}")
  if environment.check is not None and sft.hop_weights:  # SFT's own query mix
    try:
      environment.check(env, tuple(sft.hop_weights))
    except (TypeError, ValueError) as e:
      raise ConfigError(f"sft.{e}") from None
  devices = shard.num_devices or jax.device_count()
  _need(devices <= jax.device_count(), "sharding.num_devices",
        f"{devices} requested, {jax.device_count()} exist")
  try:
    sharding.mesh_shape(shard.mesh, devices)
  except ValueError as e:
    raise ConfigError(f"sharding.{e}") from None
  processes = jax.process_count()  # after `distributed.initialize`: the run's processes
  _need(train.queries_per_step % processes == 0, "train.queries_per_step",
        f"{train.queries_per_step} queries do not divide over the {processes} processes (each "
        "samples an equal share)")
  rows = train.queries_per_step * rollout.rows_per_query
  _need(rollout.shapes.num_rows >= rows, "rollout.shapes.num_rows",
        f"{rollout.shapes.num_rows} rows cannot hold train.queries_per_step="
        f"{train.queries_per_step} × {rollout.rows_per_query} rows per query")
  per_update = step.num_microbatches * train.num_minibatches
  _need(rollout.shapes.num_rows % per_update == 0, "step.num_microbatches",
        f"{step.num_microbatches} micro-batches × {train.num_minibatches} mini-batches do not "
        f"divide the batch rows {rollout.shapes.num_rows}")
  _need(not environment.answer_protocols
        or rollout.answer_protocol in environment.answer_protocols, "rollout.answer_protocol",
        f"env {env.name} is answered in {' or '.join(environment.answer_protocols)} only")
  _need(sft.steps == 0 or environment.demonstrations is not None, "sft.steps",
        f"demonstrations exist for {' and '.join(environments.names('demonstrations'))} only; "
        f"set sft.steps=0 for env.name={env.name!r} "
        "(warm-start from an SFT checkpoint with model.hf_checkpoint)")
  _need(sft.steps == 0 or sft.batch_size % step.num_microbatches == 0, "sft.batch_size",
        f"must be a multiple of step.num_microbatches={step.num_microbatches}")
  _need("greedy_outcome" not in estimator.needs or rollout.greedy_baseline,
        "rollout.greedy_baseline", f"advantage {estimator.name} needs each query's greedy "
        "rollout (Rollouts.greedy_outcome): set it true")
  _need("turn_label" not in estimator.needs or environment.turn_labels is not None,
        "advantage.name", f"advantage {estimator.name} reads each turn's ground-truth label "
        f"(Rollouts.turn_label), which env.name={env.name!r} does not give (its registry entry "
        "has no turn_labels); environments that label turns: "
        f"{', '.join(environments.names('turn_labels'))}")
  _need("answer_logprob" not in estimator.needs or environment.gold_answers, "advantage.name",
        f"advantage {estimator.name} scores the policy's probability of each task's gold answer "
        f"(Rollouts.answer_logprob), and env.name={env.name!r} has no gold answers (its registry "
        "entry's gold_answers is False); environments with gold answers: "
        f"{', '.join(environments.names('gold_answers'))}")
  _need("answer_logprob" not in estimator.needs or processes == 1, "advantage.name",
        f"advantage {estimator.name}: the answer-probe pass scores one process's rows and is "
        f"not yet split over processes; this run has {processes}")
  _check_staleness(train, loss, sampler, estimator, processes)
  critic = _own_section("critic", d["critic"])
  critic_aggregation = critic.aggregation or loss.aggregation
  try:
    aggregation_modes.check_options(critic_aggregation, loss.norm_constant)
  except ValueError as e:
    raise ConfigError(f"critic.aggregation: {e}") from None
  critic = dataclasses.replace(critic, aggregation=critic_aggregation)
  return Experiment(seed=seed, model=model, env=env, judge=judge, sampler=sampler, train=train,
                    step=step, sft=sft, estimator=estimator, advantage=advantage,
                    rollout=rollout, loss=loss, optim=optim, sharding=shard, distributed=dist,
                    critic=critic, auto_shapes=auto)


def _check_staleness(train: TrainOptions, loss: LossOptions, sampler, estimator,
                     processes: int) -> None:
  """`train.max_staleness` k >= 1 (`tirjax.trainer.staleness`) trains through the decoupled
  objective, which is the token-level rollout correction; what is not built with it is
  refused by name."""
  k = train.max_staleness
  if k == 0:
    return
  why = f"train.max_staleness={k} (k-step off-policy rollouts)"
  _need(loss.rollout_correction.is_level == "token", "loss.rollout_correction.is_level",
        f"{why} trains through the decoupled objective, whose behaviour weights are the "
        f"token-level correction: set it to \"token\", got "
        f"{loss.rollout_correction.is_level!r}")
  _need(sampler.kind == "jax", "sampler.kind",
        f"{why} is built for the JAX sampler only, got {sampler.kind!r}")
  _need(processes == 1, "train.max_staleness",
        f"{k} is built for one trainer process only; this run has {processes}")
  _need("values" not in estimator.needs, "train.max_staleness",
        f"{k} is not built for an estimator with a critic ({estimator.name}); use 0")
  _need("answer_logprob" not in estimator.needs, "train.max_staleness",
        f"{k} is not built for {estimator.name}'s answer probes (they would score the rows with "
        "other weights than those that sampled them); use 0")


def _auto_shapes(rollout: dict) -> tuple[str, ...]:
  """The rollout shapes set to "auto" in the raw section `rollout`, which this replaces by their
  value for no task (`shape_needs.floors`); a string other than "auto" names its key."""
  shapes = rollout["shapes"]
  for key, value in shapes.items():
    _need(not isinstance(value, str) or (value == shape_needs.AUTO and key in shape_needs.SIZED),
          f"rollout.shapes.{key}", f"must be an integer >= 1"
          + (f" or {shape_needs.AUTO!r} (sized from the data)" if key in shape_needs.SIZED
             else "") + f", got {value!r}")
  auto = tuple(k for k in shape_needs.SIZED if shapes.get(k) == shape_needs.AUTO)
  rollout["shapes"] = {**shapes, **shape_needs.floors(auto, rollout.get("max_new_tokens"),
                                                      rollout.get("max_steps"))}
  return auto


def fit_to_data(exp: Experiment, needs: shape_needs.Needs, split: str = "the split"
                ) -> Experiment:
  """`exp` with its "auto" shapes sized for `needs` (the tasks of `split`) and its other shapes
  checked against them (`shape_needs.fit`: one error naming every shape that is too small)."""
  try:
    shapes = shape_needs.fit(exp.rollout.shapes, exp.auto_shapes, needs,
                             exp.rollout.max_new_tokens, exp.rollout.max_steps, split)
  except ValueError as e:
    raise ConfigError(f"rollout.shapes.{e}") from None
  return dataclasses.replace(exp, rollout=dataclasses.replace(exp.rollout, shapes=shapes),
                             auto_shapes=())


def fit_to_mesh(exp: Experiment, batch_shards: int, sft_batch_size: int | None) -> Experiment:
  """Rounds the rollout rows up to a multiple of the devices that split the batch × the
  micro-batches × the mini-batches of an update pass (the extra rows are padding); the SFT
  batch must divide already. `sft_batch_size` is None for a run without SFT steps, whose
  SFT batch is never built and so is not checked."""
  _need(not exp.auto_shapes, "rollout.shapes", f"{', '.join(exp.auto_shapes)} still "
        f"{shape_needs.AUTO!r}: size them from the data first (`prepare.experiment`)")
  per_step = batch_shards * exp.step.num_microbatches
  if sft_batch_size is not None:
    _need(sft_batch_size % per_step == 0, "sft.batch_size",
          f"{sft_batch_size} must be a multiple of the batch shards ({batch_shards}) × "
          f"step.num_microbatches ({exp.step.num_microbatches})")
  per_pass = per_step * exp.train.num_minibatches
  rows = exp.rollout.shapes.num_rows
  rows = -(-rows // per_pass) * per_pass
  shapes = dataclasses.replace(exp.rollout.shapes, num_rows=rows)
  return dataclasses.replace(exp, rollout=dataclasses.replace(exp.rollout, shapes=shapes))
