"""From a locked experiment config to checked option objects, before any compute.

Every section becomes the frozen options dataclass of the component that uses it (whose
`__post_init__` rejects bad values); cross-section rules are checked here. Every error names
the config key: `ConfigError("rollout.shapes.num_rows: ...")`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax

from tirjax import advantages, sharding
from tirjax.config import dataclass_from_config
from tirjax.env.toolworld import Difficulty
from tirjax.env.toolworld.demos import DemoOptions
from tirjax.loss import LossOptions
from tirjax.models import config as model_config
from tirjax.models.config import PRESETS as MODEL_PRESETS
from tirjax.episodes.options import RolloutOptions
from tirjax.sampling.vllm import TINY_HEAD_DIM
from tirjax.training.optimizer import OptimizerOptions
from tirjax.training.sft import SFTOptions
from tirjax.training.step import StepOptions

MAX_TASKS = 200_000  # tasks or demonstrations a run may ask for (see `resolve`)
ENVS = ("toolworld", "toolhop", "ftrl", "bfcl", "doors")
DEMO_ENVS = ("toolworld", "doors")  # environments with built-in SFT demonstrations
SAMPLERS = ("jax", "vllm")
JUDGES = ("rule", "llm")


class ConfigError(ValueError):
  """An invalid experiment config; the message starts with the offending key."""


@dataclasses.dataclass(frozen=True)
class Experiment:
  """The checked options of one run (see `resolve`)."""

  estimator: advantages.Estimator
  advantage: Any  # the estimator's options dataclass
  rollout: RolloutOptions
  loss: LossOptions
  optim: OptimizerOptions
  step: StepOptions
  sft_optim: OptimizerOptions
  sft_loss: SFTOptions
  sft_step: StepOptions
  demos: DemoOptions
  sharding: sharding.ShardingOptions

  @property
  def advantage_filters_groups(self) -> bool:
    """The estimator masks whole groups (DAPO's dynamic sampling): the trainer refills them."""
    return bool(getattr(self.advantage, "dynamic_sampling", False))


def _section(cls, cfg, key: str):
  try:
    return dataclass_from_config(cls, cfg.to_dict() if hasattr(cfg, "to_dict") else cfg, key)
  except ValueError as e:
    raise ConfigError(str(e)) from None


def _need(ok: bool, key: str, problem: str) -> None:
  if not ok:
    raise ConfigError(f"{key}: {problem}")


def _int_at_least(c, key: str, low: int) -> None:
  value = c
  for part in key.split("."):
    value = value[part]
  _need(isinstance(value, int) and not isinstance(value, bool) and value >= low, key,
        f"must be an integer >= {low}, got {value!r}")


def resolve(c) -> Experiment:
  """Checks the whole config `c`; returns its option objects or raises `ConfigError`."""
  _need(c.model.preset in MODEL_PRESETS, "model.preset",
        f"unknown preset {c.model.preset!r}; valid presets are {sorted(MODEL_PRESETS)}")
  if c.model.hf_checkpoint:
    _need(os.path.isdir(c.model.hf_checkpoint), "model.hf_checkpoint",
          f"{c.model.hf_checkpoint!r} is not a directory")
  else:
    _need(c.model.preset == "tiny" and c.env.name in DEMO_ENVS, "model.hf_checkpoint",
          f"required for model.preset={c.model.preset!r} / env.name={c.env.name!r} (weights and "
          f"tokenizer); only the tiny model on {' or '.join(DEMO_ENVS)} trains from scratch")
  _int_at_least(c, "model.logprob_chunk", 1)
  _int_at_least(c, "seed", 0)
  if c.model.preset == "tiny" and not c.model.hf_checkpoint and "tiny" in c.model:
    for key in c.model.tiny:
      _int_at_least(c, f"model.tiny.{key}", 1)
    try:  # the whole model config, as the trainer will build it (vocabulary aside)
      model_config.tiny(**c.model.tiny.to_dict())
    except (TypeError, ValueError) as e:
      raise ConfigError(f"model.tiny.{e}") from None
    if c.sampler.kind == "vllm":
      _need(c.model.tiny.head_dim >= TINY_HEAD_DIM, "model.tiny.head_dim",
            f"vLLM's CPU attention needs a head size >= {TINY_HEAD_DIM}, got "
            f"{c.model.tiny.head_dim}")

  _need(c.env.name in ENVS, "env.name", f"must be one of {ENVS}, got {c.env.name!r}")
  if c.env.name in ("toolhop", "ftrl"):
    _need(os.path.exists(c.env.data_path), "env.data_path",
          f"{c.env.data_path!r} does not exist (env.name={c.env.name})")
  _int_at_least(c, "env.train_tasks", 1)
  _int_at_least(c, "env.eval_tasks", 1)
  _need(isinstance(c.env.answer_in_tool_message, bool), "env.answer_in_tool_message",
        f"must be True or False, got {c.env.answer_in_tool_message!r}")
  for key, limit in (("env.train_tasks", MAX_TASKS), ("env.eval_tasks", MAX_TASKS),
                     ("sft.num_demos", MAX_TASKS)):
    value = c.env[key.split(".")[1]] if key.startswith("env") else c.sft.num_demos
    _need(value <= limit, key, f"{value} exceeds the limit of {limit} (toolworld draws about "
          "2,000 tasks a second, so larger lists take minutes before anything else happens)")
  if c.env.name == "toolworld":
    for key, weights in (("env", c.env.hop_weights), ("sft", c.sft.hop_weights or
                                                        c.env.hop_weights)):
      try:
        Difficulty(hop_weights=tuple(weights), p_parallel=c.env.p_parallel, p_down=c.env.p_down)
      except (TypeError, ValueError) as e:
        field = str(e).split(":")[0]
        raise ConfigError(f"{key if field == 'hop_weights' else 'env'}.{e}") from None

  _need(c.judge.kind in JUDGES, "judge.kind", f"must be one of {JUDGES}, got {c.judge.kind!r}")
  if c.judge.kind == "llm":
    _need(bool(c.judge.base_url) and bool(c.judge.model), "judge.base_url",
          "the LLM judge needs judge.base_url and judge.model")
    _int_at_least(c, "judge.votes", 1)
  _need(c.sampler.kind in SAMPLERS, "sampler.kind",
        f"must be one of {SAMPLERS}, got {c.sampler.kind!r}")
  _need(c.sampler.eval_temperature >= 0, "sampler.eval_temperature", "must be >= 0")

  for key in ("train.steps", "sft.steps"):
    _int_at_least(c, key, 0)
  _int_at_least(c, "train.eval_every", 0)
  for key in ("train.queries_per_step", "train.micro_batches",
              "train.checkpoint_every", "train.keep_checkpoints", "train.log_every",
              "sft.batch_size", "sft.num_demos"):
    _int_at_least(c, key, 1)
  _int_at_least(c, "train.dynamic_sampling_tries", 0)
  rollout = _section(RolloutOptions, c.rollout, "rollout")
  try:
    estimator = advantages.get(c.advantage.name)
  except KeyError as e:
    raise ConfigError(f"advantage.name: {e.args[0]}") from None
  advantage = _section(estimator.options, c.advantage.options, "advantage.options")
  loss = _section(LossOptions, c.loss, "loss")
  optim = _section(OptimizerOptions, c.optim, "optim")
  # Without SFT steps the SFT optimizer never runs (a cosine over 0 steps is not an error then).
  sft_optim = (_section(OptimizerOptions, c.sft.optim, "sft.optim") if c.sft.steps
               else OptimizerOptions())
  sft_loss = _section(SFTOptions, c.sft.loss, "sft.loss")
  shard = _section(sharding.ShardingOptions, c.sharding, "sharding")
  devices = shard.num_devices or jax.device_count()
  _need(devices <= jax.device_count(), "sharding.num_devices",
        f"{devices} requested, {jax.device_count()} exist")
  try:
    sharding.mesh_shape(shard.mesh, devices)
  except ValueError as e:
    raise ConfigError(f"sharding.{e}") from None
  if c.sampler.kind == "vllm":
    _int_at_least(c, "sampler.vllm_kv_cache_mib", 1)

  rows = c.train.queries_per_step * rollout.rows_per_query
  _need(rollout.shapes.num_rows >= rows, "rollout.shapes.num_rows",
        f"{rollout.shapes.num_rows} rows cannot hold train.queries_per_step="
        f"{c.train.queries_per_step} × {rollout.rows_per_query} rows per query")
  _need(rollout.shapes.num_rows % c.train.micro_batches == 0, "train.micro_batches",
        f"{c.train.micro_batches} does not divide the batch rows {rollout.shapes.num_rows}")
  _need(c.env.name != "doors" or rollout.answer_protocol == "answer_tag",
        "rollout.answer_protocol", "env doors answers in one <answer> step: needs answer_tag")
  _need(c.sft.steps == 0 or c.env.name in DEMO_ENVS, "sft.steps",
        f"demonstrations exist for {' and '.join(DEMO_ENVS)} only; set sft.steps=0 for "
        f"env.name={c.env.name!r} "
        "(warm-start from an SFT checkpoint with model.hf_checkpoint)")
  _need(c.sft.batch_size % c.train.micro_batches == 0, "sft.batch_size",
        f"must be a multiple of train.micro_batches={c.train.micro_batches}")
  if loss.aggregation == "seq_mean_token_sum_norm":
    _need(loss.norm_constant is not None, "loss.norm_constant", "required by this aggregation")
  try:
    demos = DemoOptions(p_recover=c.sft.p_recover, p_detour=c.sft.p_detour,
                        p_reorder=c.sft.p_reorder, p_confuse=c.sft.p_confuse,
                        answer_protocol=rollout.answer_protocol)
  except ValueError as e:
    raise ConfigError(f"sft.{e}") from None

  step = StepOptions(num_microbatches=c.train.micro_batches,
                     logprob_chunk_size=c.model.logprob_chunk, log_entropy=c.train.log_entropy)
  sft_step = dataclasses.replace(step, log_entropy=False)
  return Experiment(estimator=estimator, advantage=advantage, rollout=rollout, loss=loss,
                    optim=optim, step=step, sft_optim=sft_optim, sft_loss=sft_loss,
                    sft_step=sft_step, demos=demos, sharding=shard)


def fit_to_mesh(exp: Experiment, batch_shards: int, sft_batch_size: int) -> Experiment:
  """Rounds the rollout rows up to a multiple of the devices that split the batch (the extra
  rows are padding); the SFT batch must divide already."""
  per_step = batch_shards * exp.step.num_microbatches
  _need(sft_batch_size % per_step == 0, "sft.batch_size",
        f"{sft_batch_size} must be a multiple of the batch shards ({batch_shards}) × "
        f"train.micro_batches ({exp.step.num_microbatches})")
  rows = exp.rollout.shapes.num_rows
  rows = -(-rows // per_step) * per_step
  shapes = dataclasses.replace(exp.rollout.shapes, num_rows=rows)
  return dataclasses.replace(exp, rollout=dataclasses.replace(exp.rollout, shapes=shapes))
