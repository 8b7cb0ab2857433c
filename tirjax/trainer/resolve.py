"""From a locked experiment config to checked option objects, before any compute.

Every section becomes a frozen options dataclass (whose `__post_init__` rejects bad values):
the experiment's own sections (`sections.py`: model, env, judge, sampler, train, sft) and the
options of the components that use the others. `resolve` is one loop over them plus the rules
that span sections. Every error names the config key:
`ConfigError("rollout.shapes.num_rows: ...")`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import jax

from tirjax import advantages, distributed, sharding
from tirjax.config import dataclass_from_config
from tirjax.env.toolworld import Difficulty
from tirjax.env.toolworld.demos import DemoOptions
from tirjax.loss import LossOptions
from tirjax.models import config as model_config
from tirjax.episodes.options import RolloutOptions
from tirjax.sampling.vllm import TINY_HEAD_DIM
from tirjax.training.optimizer import OptimizerOptions
from tirjax.training.sft import SFTLossOptions
from tirjax.training.step import StepOptions

from tirjax.trainer.sections import (DEMO_ENVS, ENVS, JUDGES, MAX_TASKS, SAMPLERS, SECTIONS,
                                       SUBSECTIONS, EnvOptions, JudgeOptions, ModelOptions,
                                       SamplerOptions, SFTOptions, TrainOptions)

__all__ = ["ConfigError", "Experiment", "resolve", "fit_to_mesh", "ENVS", "SAMPLERS", "JUDGES",
           "DEMO_ENVS", "MAX_TASKS"]


class ConfigError(ValueError):
  """An invalid experiment config; the message starts with the offending key."""


@dataclasses.dataclass(frozen=True)
class Experiment:
  """The checked options of one run (see `resolve`)."""

  model: ModelOptions
  env: EnvOptions
  judge: JudgeOptions
  sampler: SamplerOptions
  train: TrainOptions
  sft: SFTOptions
  estimator: advantages.Estimator
  advantage: Any  # the estimator's options dataclass
  rollout: RolloutOptions
  loss: LossOptions
  optim: OptimizerOptions
  step: StepOptions
  sft_optim: OptimizerOptions
  sft_loss: SFTLossOptions
  sft_step: StepOptions
  demos: DemoOptions
  sharding: sharding.ShardingOptions
  distributed: distributed.DistributedOptions

  @property
  def advantage_filters_groups(self) -> bool:
    """The estimator masks whole groups (DAPO's dynamic sampling): the trainer refills them."""
    return bool(getattr(self.advantage, "dynamic_sampling", False))


def _section(cls, cfg, key: str):
  try:
    return dataclass_from_config(cls, cfg.to_dict() if hasattr(cfg, "to_dict") else cfg, key)
  except ValueError as e:
    raise ConfigError(str(e)) from None


def _own_section(name: str, c):
  """One of the experiment's own sections; a bad value names its key as `section.key`."""
  values = {k: v for k, v in c[name].to_dict().items() if k not in SUBSECTIONS.get(name, ())}
  try:
    return dataclass_from_config(SECTIONS[name], values, name)
  except ValueError as e:
    raise ConfigError(re.sub(rf"^{name}: (\w[\w.]*): ", rf"{name}.\1: ", str(e))) from None


def _need(ok: bool, key: str, problem: str) -> None:
  if not ok:
    raise ConfigError(f"{key}: {problem}")


def distributed_options(c) -> distributed.DistributedOptions:
  """The `distributed` section alone: read before anything touches JAX's devices (the
  trainer initialises the multi-process runtime from it first)."""
  return _section(distributed.DistributedOptions, c.distributed, "distributed")


def resolve(c) -> Experiment:
  """Checks the whole config `c`; returns its option objects or raises `ConfigError`."""
  _need(isinstance(c.seed, int) and not isinstance(c.seed, bool) and c.seed >= 0, "seed",
        f"must be an integer >= 0, got {c.seed!r}")
  own = {name: _own_section(name, c) for name in SECTIONS}
  model, env, sft = own["model"], own["env"], own["sft"]
  rollout = _section(RolloutOptions, c.rollout, "rollout")
  try:
    estimator = advantages.get(c.advantage.name)
  except KeyError as e:
    raise ConfigError(f"advantage.name: {e.args[0]}") from None
  advantage = _section(estimator.options, c.advantage.options, "advantage.options")
  loss = _section(LossOptions, c.loss, "loss")
  optim = _section(OptimizerOptions, c.optim, "optim")
  # Without SFT steps the SFT optimizer never runs (a cosine over 0 steps is not an error then).
  sft_optim = (_section(OptimizerOptions, c.sft.optim, "sft.optim") if sft.steps
               else OptimizerOptions())
  sft_loss = _section(SFTLossOptions, c.sft.loss, "sft.loss")
  shard = _section(sharding.ShardingOptions, c.sharding, "sharding")
  dist = distributed_options(c)

  # -- Rules that span sections ---------------------------------------------------------------
  if not model.hf_checkpoint:
    _need(model.preset == "tiny" and env.name in DEMO_ENVS, "model.hf_checkpoint",
          f"required for model.preset={model.preset!r} / env.name={env.name!r} (weights and "
          f"tokenizer); only the tiny model on {' or '.join(DEMO_ENVS)} trains from scratch")
    if model.tiny:
      try:  # the whole model config, as the trainer will build it (vocabulary aside)
        model_config.tiny(**model.tiny)
      except (TypeError, ValueError) as e:
        raise ConfigError(f"model.tiny.{e}") from None
      if own["sampler"].kind == "vllm":
        _need(model.tiny.get("head_dim", TINY_HEAD_DIM) >= TINY_HEAD_DIM, "model.tiny.head_dim",
              f"vLLM's CPU attention needs a head size >= {TINY_HEAD_DIM}, got "
              f"{model.tiny.get('head_dim')}")
  if env.name == "toolworld":
    for key, weights in (("env", env.hop_weights), ("sft", sft.hop_weights or env.hop_weights)):
      try:
        Difficulty(hop_weights=tuple(weights), p_parallel=env.p_parallel, p_down=env.p_down,
                   p_direction=env.p_direction)
      except (TypeError, ValueError) as e:
        field = str(e).split(":")[0]
        raise ConfigError(f"{key if field == 'hop_weights' else 'env'}.{e}") from None
  devices = shard.num_devices or jax.device_count()
  _need(devices <= jax.device_count(), "sharding.num_devices",
        f"{devices} requested, {jax.device_count()} exist")
  try:
    sharding.mesh_shape(shard.mesh, devices)
  except ValueError as e:
    raise ConfigError(f"sharding.{e}") from None
  train = own["train"]
  processes = jax.process_count()  # after `distributed.initialize`: the run's processes
  _need(train.queries_per_step % processes == 0, "train.queries_per_step",
        f"{train.queries_per_step} queries do not divide over the {processes} processes (each "
        "samples an equal share)")
  rows = train.queries_per_step * rollout.rows_per_query
  _need(rollout.shapes.num_rows >= rows, "rollout.shapes.num_rows",
        f"{rollout.shapes.num_rows} rows cannot hold train.queries_per_step="
        f"{train.queries_per_step} × {rollout.rows_per_query} rows per query")
  per_update = train.micro_batches * train.num_minibatches
  _need(rollout.shapes.num_rows % per_update == 0, "train.micro_batches",
        f"{train.micro_batches} micro-batches × {train.num_minibatches} mini-batches do not "
        f"divide the batch rows {rollout.shapes.num_rows}")
  _need(env.name != "doors" or rollout.answer_protocol == "answer_tag",
        "rollout.answer_protocol", "env doors answers in one <answer> step: needs answer_tag")
  _need(sft.steps == 0 or env.name in DEMO_ENVS, "sft.steps",
        f"demonstrations exist for {' and '.join(DEMO_ENVS)} only; set sft.steps=0 for "
        f"env.name={env.name!r} "
        "(warm-start from an SFT checkpoint with model.hf_checkpoint)")
  _need(sft.batch_size % train.micro_batches == 0, "sft.batch_size",
        f"must be a multiple of train.micro_batches={train.micro_batches}")
  _need("greedy_outcome" not in estimator.needs or rollout.greedy_baseline,
        "rollout.greedy_baseline", f"advantage {estimator.name} needs each query's greedy "
        "rollout (Rollouts.greedy_outcome): set it true")
  if loss.aggregation == "seq_mean_token_sum_norm":
    _need(loss.norm_constant is not None, "loss.norm_constant", "required by this aggregation")
  try:
    demos = DemoOptions(p_recover=sft.p_recover, p_detour=sft.p_detour,
                        p_reorder=sft.p_reorder, p_confuse=sft.p_confuse,
                        answer_protocol=rollout.answer_protocol)
  except ValueError as e:
    raise ConfigError(f"sft.{e}") from None

  if train.tempered_policy:
    _need(rollout.temperature > 0, "train.tempered_policy",
          "needs a sampling temperature > 0 (rollout.temperature = 0 is greedy)")
  step = StepOptions(num_microbatches=train.micro_batches,
                     logprob_chunk_size=model.logprob_chunk, log_entropy=train.log_entropy,
                     temperature=rollout.temperature if train.tempered_policy else 1.0)
  sft_step = dataclasses.replace(step, log_entropy=False, temperature=1.0)
  return Experiment(**own, estimator=estimator, advantage=advantage, rollout=rollout,
                    loss=loss, optim=optim, step=step, sft_optim=sft_optim, sft_loss=sft_loss,
                    sft_step=sft_step, demos=demos, sharding=shard, distributed=dist)


def fit_to_mesh(exp: Experiment, batch_shards: int, sft_batch_size: int) -> Experiment:
  """Rounds the rollout rows up to a multiple of the devices that split the batch × the
  micro-batches × the mini-batches of an update pass (the extra rows are padding); the SFT
  batch must divide already."""
  per_step = batch_shards * exp.step.num_microbatches
  _need(sft_batch_size % per_step == 0, "sft.batch_size",
        f"{sft_batch_size} must be a multiple of the batch shards ({batch_shards}) × "
        f"train.micro_batches ({exp.step.num_microbatches})")
  per_pass = per_step * exp.train.num_minibatches
  rows = exp.rollout.shapes.num_rows
  rows = -(-rows // per_pass) * per_pass
  shapes = dataclasses.replace(exp.rollout.shapes, num_rows=rows)
  return dataclasses.replace(exp, rollout=dataclasses.replace(exp.rollout, shapes=shapes))
