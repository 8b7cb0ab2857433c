"""Base experiment config: every section, with the presets shared by all estimator configs.

Not run directly: each `configs/<estimator>.py` calls `make(arg, estimator=..., ...)` with its
paper's defaults. The config argument is a comma-separated list of presets:

  model=tiny|qwen3_0p6b|qwen3_1p7b|qwen3_4b|qwen3_8b|qwen2p5_7b|llama3_8b
  env=toolworld|toolhop|ftrl|bfcl        sampler=jax|vllm
  mesh=DxFxT (data x fsdp x tensor; -1 = the remaining devices, e.g. mesh=-1x2x1)
  rollout=independent|tree|arpo          (overrides the estimator's rollout mode)

e.g. `--config=configs/portool.py:model=tiny,env=toolworld`. Every key can then be set on the
command line (`--config.advantage.options.alpha=0.5`); the config is locked, so a mistyped key
fails, and `experiments.train` validates every value before any compute.
"""

from __future__ import annotations

import ml_collections

from tirjax import advantages, loss, sharding
from tirjax.config import config_from_dataclass, parse_preset_arg
from tirjax.models.config import PRESETS as MODEL_PRESETS
from tirjax.rollout.options import MODES, RolloutOptions

ENVS = ("toolworld", "toolhop", "ftrl", "bfcl")
SAMPLERS = ("jax", "vllm")
DATA = {"toolhop": "../shared/data/toolhop/toolhop100.jsonl",
        "ftrl": "../shared/data/ftrl/ftrl_test.parquet", "bfcl": "", "toolworld": ""}
PRESET_KEYS = {"model": tuple(MODEL_PRESETS), "env": ENVS, "sampler": SAMPLERS, "mesh": None,
               "rollout": MODES}


def make(arg: str | None, *, estimator: str, rollout: dict | None = None,
         loss_options: dict | None = None, optim: dict | None = None,
         advantage_options: dict | None = None) -> ml_collections.ConfigDict:
  """The full, locked config for `estimator` with its paper defaults and the presets in `arg`."""
  presets = parse_preset_arg(arg, PRESET_KEYS)
  c = ml_collections.ConfigDict()
  c.seed = 0

  c.model = ml_collections.ConfigDict()
  c.model.preset = presets.get("model", "tiny")
  c.model.hf_checkpoint = ""  # a local HF directory (weights + tokenizer); required for real presets
  c.model.dtype = "float32"
  c.model.logprob_chunk = 256  # tokens per chunk of the log-prob / entropy computation

  c.env = ml_collections.ConfigDict()
  c.env.name = presets.get("env", "toolworld")
  c.env.data_path = DATA[c.env.name]
  c.env.train_tasks = 2000
  c.env.eval_tasks = 64
  c.env.p_down = 0.1  # toolworld: share of queries whose needed tool is down
  c.env.p_parallel = 0.5  # toolworld: share of multi-hop queries with parallel calls
  c.env.hop_weights = (0.25, 0.35, 0.25, 0.15)  # toolworld: 1..4 hops

  c.judge = ml_collections.ConfigDict()
  c.judge.kind = "rule"  # or "llm": an OpenAI-compatible endpoint, five votes, majority
  c.judge.base_url = ""
  c.judge.model = ""
  c.judge.votes = 5

  c.sampler = ml_collections.ConfigDict()
  c.sampler.kind = presets.get("sampler", "jax")
  c.sampler.vllm_python = ".venv-vllm/bin/python"  # the interpreter that runs `vllm` (launch)
  c.sampler.vllm_url = ""  # attach to a running server instead of launching one
  c.sampler.vllm_memory_fraction = 0.1
  c.sampler.eval_temperature = 0.0

  c.rollout = config_from_dataclass(RolloutOptions(**(rollout or {})))
  if "rollout" in presets:
    c.rollout.mode = presets["rollout"]

  c.advantage = ml_collections.ConfigDict()
  c.advantage.name = estimator
  c.advantage.options = config_from_dataclass(
      advantages.get(estimator).make_options(advantage_options or {}))

  c.loss = config_from_dataclass(loss.LossOptions(**(loss_options or {})))

  c.optim = ml_collections.ConfigDict(dict(
      learning_rate=1e-6, warmup_steps=0, schedule="constant", weight_decay=0.0, b1=0.9,
      b2=0.999, grad_clip=1.0, micro_batches=1, updates_per_batch=1, **(optim or {})))

  c.sft = ml_collections.ConfigDict(dict(
      steps=0, batch_size=16, learning_rate=1e-5, warmup_steps=0, num_demos=2000,
      p_recover=0.15, p_detour=0.1, p_reorder=0.3))

  c.train = ml_collections.ConfigDict(dict(
      steps=100, queries_per_step=8, eval_every=20, checkpoint_every=20, keep_checkpoints=3,
      log_every=1, progress_bar=True, export_final=True, dynamic_sampling_tries=4))

  c.sharding = config_from_dataclass(sharding.ShardingOptions())
  if "mesh" in presets:
    c.sharding.mesh = _parse_mesh(presets["mesh"])

  if c.model.preset == "tiny":
    _tiny_scale(c)
  c.lock()
  return c


def _tiny_scale(c: ml_collections.ConfigDict) -> None:
  """CPU scale: the tiny model on short toolworld episodes, learning rates that move it."""
  c.optim.learning_rate = 3e-4
  c.sft.steps = 300
  c.sft.learning_rate = 3e-3
  c.rollout.max_new_tokens = 96
  c.rollout.shapes.max_tokens = 768
  c.rollout.shapes.max_gt_calls = 8
  c.rollout.shapes.max_params = 4


def _parse_mesh(text: str) -> tuple:
  sizes = text.split("x")
  if len(sizes) != 3:
    raise ValueError(f"mesh={text}: expected DATAxFSDPxTENSOR, e.g. mesh=-1x2x1")
  try:
    return tuple(zip(("data", "fsdp", "tensor"), (int(s) for s in sizes)))
  except ValueError:
    raise ValueError(f"mesh={text}: sizes must be integers (-1 = the remaining devices)") from None
