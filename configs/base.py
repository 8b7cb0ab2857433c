"""The paper protocols the estimator configs share, and `make`, which every config calls.

Not run directly: each `configs/<estimator>.py` calls `make(arg, estimator=..., ...)` with its
paper's protocol (often `portool_protocol()` or `hidifftir_protocol()` below). Everything else
about a config lives in one module, `tirjax.trainer.sections`: its sections, the preset
argument

  model=tiny|qwen3_0p6b|qwen3_1p7b|qwen3_4b|qwen3_8b|qwen2p5_7b|llama3_8b
  env=toolworld|toolhop|ftrl|bfcl|doors  sampler=jax|vllm
  mesh=DxFxT (data x fsdp x tensor; -1 = the remaining devices, e.g. mesh=-1x2x1)
  rollout=independent|tree|arpo          (overrides the estimator's rollout mode)
  steps=N                                (RL steps)
  smoke=1                                (a smoke run: every stage, a few steps on a few tasks)

(e.g. `--config=configs/portool.py:model=tiny,env=toolworld`), the named presets it implies
(`cpu_scale` for the tiny model, the environment's own from its registry entry, `smoke`), and
where each value came from: `python -m experiments.train --config=configs/grpo.py:model=tiny
--print_config` prints every key with its value, its source and its description. Every key can
then be set on the command line (`--config.advantage.options.alpha=0.5`); the config is locked,
so a mistyped key fails, and `experiments.train` checks every value (`tirjax.trainer.resolve`)
before any compute.

The rollout shapes L, C, P and T (`rollout.shapes.max_tokens`, `max_gt_calls`, `max_params`,
`max_steps`) are "auto" unless a preset pins them: sized from the tasks the run will use
(`tirjax.trainer.shape_needs`), so that `model=<preset>` fits any `env=`.
"""

from __future__ import annotations

import ml_collections

from tirjax import advantages
from tirjax.advantages.registry import thawed
from tirjax.loss import aggregation
from tirjax.trainer.sections import make  # noqa: F401  (the configs' `base.make`)


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
  aggregation mode needs a constant (its record, `tirjax.loss.aggregation.MODES`) and has none
  gets a placeholder, which
  `estimator_config` replaces by the longest row."""
  entry = advantages.get(estimator)
  out = PROTOCOLS[entry.protocol]()
  out["rollout"] = _merged(out.get("rollout", {}), thawed(entry.rollout))
  out["loss"] = _merged(out.get("loss", {}), thawed(entry.loss))
  out["loss"] = aggregation.with_norm_constant(out["loss"], 1)
  return out


def estimator_config(arg: str | None, estimator: str) -> ml_collections.ConfigDict:
  """The locked config of a registered estimator on its registration's protocol
  (`registered`), then the presets in `arg`: what `configs/<estimator>.py` returns, and
  `configs/estimator.py` for an estimator without a file of its own. Dr. GRPO's constant (a
  mode that needs one, without one) is the longest row, T_max times the tokens per
  step, a live reference: an override of rollout.max_steps or max_new_tokens moves it."""
  c = make(arg, estimator=estimator, **registered(estimator))
  if ("norm_constant" not in advantages.get(estimator).loss
      and aggregation.lookup(c.loss.aggregation).needs_norm_constant):
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
