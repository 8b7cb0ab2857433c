"""Base experiment config: every section, with the presets shared by all estimator configs.

Not run directly: each `configs/<estimator>.py` calls `make(arg, estimator=..., ...)` with its
paper's defaults. The config argument is a comma-separated list of presets:

  model=tiny|qwen3_0p6b|qwen3_1p7b|qwen3_4b|qwen3_8b|qwen2p5_7b|llama3_8b
  env=toolworld|toolhop|ftrl|bfcl|doors  sampler=jax|vllm
  mesh=DxFxT (data x fsdp x tensor; -1 = the remaining devices, e.g. mesh=-1x2x1)
  rollout=independent|tree|arpo          (overrides the estimator's rollout mode)
  steps=N                                (RL steps)
  smoke=1                                (a smoke run: every stage, a few steps on a few tasks)

e.g. `--config=configs/portool.py:model=tiny,env=toolworld`. After the preset argument, `make`
applies the named presets it implies (`NAMED_PRESETS`, in this order):

  cpu_scale           model=tiny: sizes, steps and learning rates for a 2-core CPU
  toolworld_headroom  model=tiny on toolworld (`make run`): RL with headroom and one lever
  bfcl                env=bfcl: BFCL multi-turn's T_max and shapes
  doors               env=doors: the doors bandit's small model and short run
  smoke               smoke=1: every stage for a few steps on a few tasks

`python -m experiments.train --config=configs/grpo.py:model=tiny --print_config` prints every
key with its value and where it came from (`provenance`: the options' defaults, the estimator's
config, the preset argument, a named preset, the command line). Every key can then be set on the
command line (`--config.advantage.options.alpha=0.5`); the config is locked, so a mistyped key
fails, and `experiments.train` checks every value (`tirjax.trainer.resolve`) before any
compute.

The rollout shapes L, C, P and T (`rollout.shapes.max_tokens`, `max_gt_calls`, `max_params`,
`max_steps`) are "auto" unless a preset pins them: sized from the tasks the run will use
(`tirjax.trainer.shape_needs`), so that `model=<preset>` fits any `env=`. The tiny model on the
built-in environments (toolworld, doors) and `env=bfcl` pin theirs; a pinned shape too small
for the data fails before any compute, naming every shape and the least it must be.

Each section holds one options dataclass's fields under their own names: `step` is the train
step's `StepOptions`, `sft.optim`, `sft.loss` and `sft.demos` the warm start's optimizer, loss
and demonstrations, `advantage.options` the estimator's (`tirjax.trainer.sections`).
"""

from __future__ import annotations

import contextvars
from typing import Any, Callable

import ml_collections

from tirjax import advantages, distributed, rundir, sharding
from tirjax.advantages.registry import thawed
from tirjax.ablation import grid
from tirjax.config import config_from_dataclass, dataclass_from_config, parse_preset_arg
from tirjax.env import environments
from tirjax.trainer import sections, shape_needs
from tirjax.trainer.sections import SAMPLERS
from tirjax.loss import LossOptions
from tirjax.models.config import PRESETS as MODEL_PRESETS
from tirjax.episodes.options import MODES, RolloutOptions
from tirjax.train_steps.optimizer import OptimizerOptions

PRESET_KEYS = {"model": tuple(MODEL_PRESETS), "env": tuple(environments.names()),
               "sampler": SAMPLERS, "mesh": None, "rollout": MODES, "steps": None, "smoke": ("1",)}
NAMED_PRESETS = ("cpu_scale", "toolworld_headroom", "bfcl", "doors", "smoke")
# The named presets `make` may apply: all of them, except while `provenance` rebuilds a config
# without some to see what each one set.
_APPLIED = contextvars.ContextVar("tirjax_named_presets", default=NAMED_PRESETS)


def hidifftir_protocol() -> dict:
  """How HiDiffTIR trains itself and its baselines (§4.1, App. A.5): groups of 16 independent
  rollouts at temperature 1.0, at most 10 turns, answers in `<answer>` tags; a global batch of
  256 queries in mini-batches of 32 (8 updates per rollout batch); KL 0.001 (k3), entropy
  bonus 0.001, lr 1e-6. `make(arg, estimator=..., **hidifftir_protocol())`."""
  return dict(rollout=dict(mode="independent", n=16, max_steps=10, temperature=1.0,
                           answer_protocol="answer_tag", shapes=dict(max_steps=10)),
              train=dict(queries_per_step=256, mini_batch_queries=32),
              loss=dict(kl_coef=0.001, kl_estimator="k3", entropy_coef=0.001),
              optim=dict(learning_rate=1e-6))


def portool_protocol(mode: str = "independent", rollout: dict | None = None,
                     loss: dict | None = None) -> dict:
  """How PORTool compares its baselines: groups of n = 8 rollouts (`mode`), T_max = 6, the
  clipped surrogate (ε = 0.2) averaged per trajectory, no KL term; `rollout` and `loss` add to
  or replace these. PORTool states no batch or mini-batch size; it trains on verl, whose
  default makes 4 updates per rollout batch (`ppo_mini_batch_size` 256 of `train_batch_size`
  1,024): mini-batches of a quarter of the step's 8 queries."""
  return dict(rollout=dict(dict(mode=mode, n=8, max_steps=6), **(rollout or {})),
              train=dict(queries_per_step=8, mini_batch_queries=2),
              loss=dict(dict(kl_coef=0.0, aggregation="seq_mean_token_mean"), **(loss or {})))


PROTOCOLS = {"portool": portool_protocol, "hidifftir": hidifftir_protocol}


def registered(estimator: str) -> dict:
  """`make`'s sections for `estimator` from its registration (`tirjax.advantages.registry`): its
  protocol's (`PROTOCOLS`) with its paper's rollout and loss settings on top. A loss whose
  aggregation is `seq_mean_token_sum_norm` without a constant gets a float placeholder, which
  `estimator_config` replaces by the longest row."""
  entry = advantages.get(estimator)
  out = PROTOCOLS[entry.protocol]()
  out["rollout"] = _merged(out.get("rollout", {}), thawed(entry.rollout))
  out["loss"] = _merged(out.get("loss", {}), thawed(entry.loss))
  if out["loss"].get("aggregation") == "seq_mean_token_sum_norm":
    out["loss"].setdefault("norm_constant", 1.0)
  return out


def estimator_config(arg: str | None, estimator: str) -> ml_collections.ConfigDict:
  """The locked config of a registered estimator on its registration's protocol
  (`registered`), then the presets in `arg`: what `configs/<estimator>.py` returns, and
  `configs/estimator.py` for an estimator without a file of its own. Dr. GRPO's constant (a
  `seq_mean_token_sum_norm` loss without one) is the longest row, T_max times the tokens per
  step, a live reference: an override of rollout.max_steps or max_new_tokens moves it."""
  c = make(arg, estimator=estimator, **registered(estimator))
  if ("norm_constant" not in advantages.get(estimator).loss
      and c.loss.aggregation == "seq_mean_token_sum_norm"):
    c.loss.norm_constant = (c.rollout.get_ref("max_steps") *
                            c.rollout.get_ref("max_new_tokens")).to_float()
  return c


def _merged(base_values: dict, more: dict) -> dict:
  """`base_values` with `more` on top, section by section."""
  out = dict(base_values)
  for key, value in more.items():
    out[key] = (_merged(out[key], value) if isinstance(value, dict)
                and isinstance(out.get(key), dict) else value)
  return out


def make(arg: str | None, *, estimator: str, rollout: dict | None = None,
         loss: dict | None = None, optim: dict | None = None,
         advantage: dict | None = None, train: dict | None = None) -> ml_collections.ConfigDict:
  """The locked config of `estimator` with its paper's defaults, then the presets in `arg`."""
  presets = parse_preset_arg(arg, PRESET_KEYS)
  c = ml_collections.ConfigDict()
  c.seed = 0

  # The experiment's own sections and the step's, generated from their options
  # (`tirjax.trainer.sections`; without the values `resolve` derives), then the presets
  # (checked only by `resolve`: a dataset file need not exist to build one).
  for name, options in sections.SECTIONS.items():
    c[name] = config_from_dataclass(options, omit=sections.DERIVED.get(name, ()))
  for name, options in sections.env_sections().items():  # each environment's own: env.<name>
    c.env[name] = config_from_dataclass(options)
  # RL's update and log-prob passes forward each query group once, as a packed forest, and SFT
  # each batch of demonstrations: the padded path's loss and gradients (issue 38;
  # tests/test_packed_update.py, tests/test_packed_sft.py), faster as
  # benchmarks/results/bench_update_cpu.json measures. False: the padded path.
  c.step.packed = True
  env = presets.get("env", "toolworld")
  c.model.preset = presets.get("model", "tiny")
  c.env.update(name=env, data_path=environments.get(env).data_path)
  c.sampler.kind = presets.get("sampler", "jax")
  c.train.update(train or {})
  c.train.steps = _parse_steps(presets.get("steps", "100"))

  c.rollout = config_from_dataclass(dataclass_from_config(RolloutOptions, rollout, "rollout"),
                                    omit=sections.DERIVED["rollout"])
  _sized_shapes(c, (rollout or {}).get("shapes", {}))
  if "rollout" in presets:
    c.rollout.mode = presets["rollout"]

  c.advantage = ml_collections.ConfigDict()
  c.advantage.name = estimator
  c.advantage.options = config_from_dataclass(
      advantages.get(estimator).make_options(advantage or {}))

  c.loss = config_from_dataclass(dataclass_from_config(LossOptions, loss, "loss"))
  c.optim = config_from_dataclass(dataclass_from_config(OptimizerOptions, optim, "optim"))

  # Rows per batch follow the queries per step and the rows per query (a live reference).
  per_query = (c.rollout.arpo.get_ref("total_rollouts") if c.rollout.mode == "arpo"
               else c.rollout.get_ref("n"))
  c.rollout.shapes.num_rows = c.train.get_ref("queries_per_step") * per_query

  c.sharding = config_from_dataclass(sharding.ShardingOptions())
  c.distributed = config_from_dataclass(distributed.DistributedOptions())
  if "mesh" in presets:
    c.sharding.mesh = _parse_mesh(presets["mesh"])

  # The named presets the preset argument implies (`NAMED_PRESETS`), in that order.
  applied, tiny, steps_given = _APPLIED.get(), c.model.preset == "tiny", "steps" in presets
  if tiny and "cpu_scale" in applied:
    _cpu_scale(c, env, steps_given)
  if tiny and env == "toolworld" and "toolworld_headroom" in applied:
    _toolworld_headroom(c, steps_given)
  if env == "bfcl" and "bfcl" in applied:
    _bfcl(c)
  if env == "doors" and "doors" in applied:
    _doors(c, steps_given)
  if "smoke" in presets and "smoke" in applied:
    _smoke(c, env, steps_given)
  c.lock()
  return c


def _flat(c: ml_collections.ConfigDict) -> dict[str, Any]:
  return rundir.flatten(c.to_dict())


def _built(get_config: Callable, arg: str | None, applied: tuple) -> dict[str, Any]:
  token = _APPLIED.set(applied)
  try:
    return _flat(get_config(arg))
  finally:
    _APPLIED.reset(token)


def provenance(get_config: Callable, config_file: str, arg: str | None,
               final: ml_collections.ConfigDict) -> list[tuple[str, Any, str]]:
  """Each key of `final` (`get_config(arg)`, `config_file`'s, then the command line) as
  (key, value, source), sorted by key. The source is the last layer that set the value, the
  layers being: "default" (the options' dataclass defaults, as `make` builds them for the
  estimator without a protocol), `config_file` (the estimator's paper protocol), "preset
  argument" (`arg`'s model=, env=, ... values), "preset <name>" (each of `NAMED_PRESETS` that
  applies, in order) and "command line"."""
  token = _APPLIED.set(())
  try:
    defaults = _flat(make(None, estimator=final.advantage.name))
  finally:
    _APPLIED.reset(token)
  layers = [("default", defaults), (config_file, _built(get_config, None, ()))]
  if arg:
    layers.append(("preset argument", _built(get_config, arg, ())))
  for i, name in enumerate(NAMED_PRESETS):
    layers.append((f"preset {name}", _built(get_config, arg, NAMED_PRESETS[:i + 1])))
  layers.append(("command line", _flat(final)))
  missing = object()
  out = []
  for key, value in sorted(layers[-1][1].items()):
    source, before = "default", missing
    for name, values in layers:
      now = values.get(key, missing)
      if now is not missing and (before is missing or now != before):
        source = name
      before = now
    out.append((key, value, source))
  return out


def provenance_text(config_spec: str, final: ml_collections.ConfigDict) -> str:
  """`provenance` of `config_spec` ("<config file>[:<arg>]", as `--config` takes it) whose
  final config is `final`, one `key = value  # source` line per key (`--print_config`)."""
  config_file, _, arg = config_spec.partition(":")
  module = grid.config_module(config_file)
  get_config = module.get_config
  if hasattr(module, "split_arg"):  # configs/estimator.py: its first item is no preset
    own, arg = module.split_arg(arg)
    get_config = lambda presets: module.get_config(",".join(filter(None, (own, presets))))
  return "\n".join(f"{key} = {value!r}  # {source}"
                   for key, value, source in provenance(get_config, config_file, arg or None,
                                                        final))


def _sized_shapes(c: ml_collections.ConfigDict, given: dict) -> None:
  """The shapes that may be sized from the data (`shape_needs.SIZED`): "auto" unless the
  estimator's protocol gives them; each key takes a number or "auto" (on the command line too:
  `--config.rollout.shapes.max_tokens=8192`)."""
  for key in shape_needs.SIZED:
    value = given.get(key, shape_needs.AUTO)
    del c.rollout.shapes[key]  # an int field would refuse "auto"
    c.rollout.shapes[key] = ml_collections.FieldReference(value, field_type=object)


# The tiny policy's sizes (`tirjax.models.config.tiny` with these changes). Measured on 2 CPU
# cores: d=128 with head size 32 reaches an SFT loss of 0.84 in 300 steps (192 s) where the
# d=64 / head size 16 default needs ~470 steps (~245 s); 4 layers were slower per second.
TINY_SIZES = dict(hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=32)


def _cpu_scale(c: ml_collections.ConfigDict, env: str, steps_given: bool) -> None:
  """The tiny model on short episodes: sizes, steps and learning rates that fit a 2-core CPU
  (toolworld's RL design is `_toolworld_headroom`'s). On the built-in environments, shapes
  made for toolworld's tasks (prompts of at most 146 tokens, 5 ground-truth calls of at most
  3 arguments, 4 tool steps and the answer); on the datasets, shapes sized from their tasks."""
  if not steps_given:
    c.train.steps = 40
  c.model.tiny = ml_collections.ConfigDict(TINY_SIZES)
  c.step.logprob_chunk_size = 256
  c.env.eval_tasks = 256
  c.sft.steps = 800
  c.sft.optim.learning_rate = 1e-2
  c.sft.optim.warmup_steps = 20
  c.sft.optim.schedule = "cosine"
  # `ref + 0`, not the bare reference: an override of the derived key then replaces it, where
  # a shared reference would silently change sft.steps too.
  c.sft.optim.decay_steps = c.sft.get_ref("steps") + 0
  c.sft.optim.final_lr_fraction = 0.05
  c.optim.learning_rate = 3e-4
  c.optim.weight_decay = 0.0
  c.train.queries_per_step = 3
  c.train.mini_batch_queries = 0
  c.train.eval_every = 0  # evaluated after SFT and after the last RL step only
  c.rollout.max_steps = 6  # toolworld needs at most 4 tool steps and the answer
  c.rollout.shapes.max_steps = c.rollout.get_ref("max_steps") + 0
  c.rollout.max_new_tokens = 64
  if env in environments.names("demonstrations"):
    c.rollout.shapes.update(max_tokens=512, max_gt_calls=8, max_params=4)


def _toolworld_headroom(c: ml_collections.ConfigDict, steps_given: bool) -> None:
  """Toolworld with the tiny model (`make run`), designed so that RL has headroom and a lever
  on a 2-core CPU (issue 26; benchmarks/results/default_run.json).

  The warm start: 1200 SFT steps at lr 1e-2 on demonstrations that never show which way a
  direction-taking tool must be called (`sft.demos.p_confuse=1`: both directions
  demonstrated), on queries that all need a direction (`env.toolworld.p_direction=1`) with
  1-3 hops (`hop_weights`). SFT then teaches the format, the plan and the copying of names and
  values but leaves the direction a coin flip, which only outcomes can teach (the warm starts'
  accuracy, headroom and mixed groups: benchmarks/results/default_run.json).

  RL: 8 queries x 6 rows per step in 4 mini-batches (4 updates per rollout batch, as verl's
  default), sampled at T = 0.6 with the loss on the tempered policy (`train.tempered_policy`),
  lr 3e-4, 40 steps; what RL gains, mostly by removing direction failures:
  benchmarks/results/default_run.json.

  Why 1200 steps: with 600, the warm starts' accuracy depended on the CPU (the same seed's SFT
  differs by CPU), and where they miscopied names and values RL had nothing to take
  (benchmarks/results/default_run_sft600*.json). At T = 1 the same budget gained less, and
  lr 1e-3 collapsed (entropy up, accuracy down).
  """
  if not steps_given:
    c.train.steps = 40
  c.sft.steps = 1200
  c.step.logprob_chunk_size = 2048  # the whole row: fewer, larger matmuls on the CPU
  c.env.toolworld.update(p_direction=1.0, hop_weights=(0.35, 0.45, 0.2, 0.0))
  c.sft.demos.p_confuse = 1.0
  c.train.queries_per_step = 8
  c.train.mini_batch_queries = 2
  c.rollout.n = 6
  c.rollout.temperature = 0.6
  c.train.tempered_policy = True


def _bfcl(c: ml_collections.ConfigDict) -> None:
  """BFCL multi-turn (spec §6.1): all of an entry's user turns in one episode. Its longest
  ground truth takes 37 steps one call at a time (35 calls over up to 8 turns, plus each turn's
  closing message), so T_max = 48; C = 40 ground-truth calls, P = 8 arguments (6 at most in
  the data); L = 16,384 tokens (the system prompt's function docs alone take 4-7k tokens with
  the toolworld tokenizer)."""
  c.rollout.max_steps = 48
  c.rollout.shapes.max_steps = c.rollout.get_ref("max_steps") + 0
  c.rollout.shapes.update(max_gt_calls=40, max_params=8, max_tokens=16384)


def _doors(c: ml_collections.ConfigDict, steps_given: bool) -> None:
  """The doors bandit (`tirjax.env.bandit`): one-token answers in one step, a small model, SFT
  that teaches the format only, then RL that must find each room's door (about 2 min on CPU)."""
  c.model.tiny = ml_collections.ConfigDict(dict(
      hidden_size=64, intermediate_size=128, num_layers=1, num_heads=2, num_kv_heads=1,
      head_dim=32))
  c.env.update(train_tasks=16, eval_tasks=16)
  c.sft.update(steps=60, batch_size=16, num_demos=256)
  c.sft.optim.update(learning_rate=3e-3, schedule="constant", warmup_steps=0)
  c.optim.update(learning_rate=3e-3, weight_decay=0.0)
  c.rollout.update(answer_protocol="answer_tag", max_steps=1, max_new_tokens=4)
  c.rollout.shapes.update(max_tokens=96, max_steps=1)
  c.train.update(queries_per_step=4, eval_every=10, checkpoint_every=10)
  if not steps_given:
    c.train.steps = 30


def _smoke(c: ml_collections.ConfigDict, env: str, steps_given: bool) -> None:
  """`smoke=1`: every stage of the run (SFT if it has one, RL, evaluation, export) for a few
  steps on a few tasks, episodes of at most 2 short steps, to check that a command runs, not
  what it learns. On a dataset the context is sized from those few tasks ("auto")."""
  if not steps_given:
    c.train.steps = 2
  if c.sft.steps:
    c.sft.update(steps=2, batch_size=2, num_demos=8)
  c.env.update(train_tasks=8, eval_tasks=2)
  c.train.update(queries_per_step=2, mini_batch_queries=1, eval_every=0, checkpoint_every=1)
  c.rollout.update(n=2, max_steps=min(c.rollout.max_steps, 2), max_new_tokens=16)
  c.rollout.arpo.update(initial_rollouts=2, total_rollouts=3)
  if env not in environments.names("demonstrations"):
    c.rollout.shapes.max_tokens = shape_needs.AUTO


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
