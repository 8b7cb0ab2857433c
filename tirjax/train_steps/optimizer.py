"""The optimizer: global-norm clipping, then AdamW with a warmup + constant / cosine schedule.

    tx = make_optimizer(OptimizerOptions(learning_rate=1e-6, warmup_steps=10))
    ...
    learning_rate(opt_state)   # the rate the last update used (0-th update: warmup start)

Defaults are verl's actor optimizer (lr 1e-6, betas (0.9, 0.999), weight decay 0.01 on every
parameter, gradient clip 1.0, no warmup, constant rate), which PORTool and HiDiffTIR train
with. The learning rate is an injected hyperparameter (`optax.inject_hyperparams`), so the
optimizer state records the rate of each update and a restored state resumes the schedule.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, Optional, get_args

import jax
import jax.numpy as jnp
import optax

from tirjax import option_checks

Schedule = Literal["constant", "cosine"]
SCHEDULES = get_args(Schedule)


@dataclasses.dataclass(frozen=True)
class OptimizerOptions:
  """AdamW with global-norm clipping and a learning-rate schedule.

  Attributes:
    learning_rate: the peak rate (reached at the end of warmup).
    schedule: "constant" (the peak rate after warmup) or "cosine" (decays from the peak to
      `final_lr_fraction · learning_rate` over `decay_steps` updates after warmup, then stays).
    warmup_steps: updates of linear warmup from 0 to the peak (0: none).
    decay_steps: length of the cosine decay (required > 0 by "cosine", unused otherwise).
    final_lr_fraction: the cosine's end rate as a fraction of the peak.
    b1, b2, eps: Adam's moment decays and denominator epsilon.
    weight_decay: decoupled weight decay (AdamW), applied to every parameter.
    max_grad_norm: clip the global gradient norm to this before Adam; None: no clipping.
  """

  learning_rate: float = 1e-6
  schedule: Schedule = "constant"
  warmup_steps: int = 0
  decay_steps: int = 0
  final_lr_fraction: float = 0.0
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  weight_decay: float = 0.01
  max_grad_norm: Optional[float] = 1.0

  def __post_init__(self):
    option_checks.finite_above("learning_rate", self.learning_rate, 0)
    option_checks.typed_choices(self)
    option_checks.int_at_least("warmup_steps", self.warmup_steps, 0)
    option_checks.int_at_least("decay_steps", self.decay_steps, 0)
    if self.schedule == "cosine" and self.decay_steps < 1:
      raise ValueError("decay_steps: schedule='cosine' needs decay_steps >= 1 (the updates "
                       f"over which the rate decays), got {self.decay_steps}")
    option_checks.lies_in("final_lr_fraction", self.final_lr_fraction, 0, 1)
    option_checks.lies_in("b1", self.b1, 0, 1, open_high=True)
    option_checks.lies_in("b2", self.b2, 0, 1, open_high=True)
    option_checks.finite_above("eps", self.eps, 0)
    option_checks.finite_at_least("weight_decay", self.weight_decay, 0)
    option_checks.finite_above("max_grad_norm", self.max_grad_norm, 0, none_ok=True)


def learning_rate_schedule(opts: OptimizerOptions) -> optax.Schedule:
  """η(n) for update n = 0, 1, ...: `η·(n+1)/(W+1)` for n < W (so the first update does not
  have rate 0), then η (constant), or for cosine with D = `decay_steps` and
  f = `final_lr_fraction`: `η·(f + (1 − f)·(1 + cos(π·min(n − W, D)/D))/2)`
  (Loshchilov & Hutter 2017, without restarts)."""
  peak, warmup = opts.learning_rate, opts.warmup_steps

  def schedule(count):
    n = jnp.asarray(count, jnp.float32)
    ramp = peak * (n + 1) / (warmup + 1)
    if opts.schedule == "constant":
      after = jnp.asarray(peak, jnp.float32)
    else:
      progress = jnp.clip(n - warmup, 0, opts.decay_steps) / opts.decay_steps
      f = opts.final_lr_fraction
      after = peak * (f + (1 - f) * 0.5 * (1 + jnp.cos(jnp.pi * progress)))
    return jnp.where(n < warmup, ramp, after)

  return schedule


def make_optimizer(opts: OptimizerOptions = OptimizerOptions()) -> optax.GradientTransformation:
  """`clip_by_global_norm(max_grad_norm)` → AdamW(schedule) (Loshchilov & Hutter 2019)."""
  adamw = optax.inject_hyperparams(optax.adamw)(
      learning_rate=learning_rate_schedule(opts), b1=opts.b1, b2=opts.b2, eps=opts.eps,
      weight_decay=opts.weight_decay)
  if opts.max_grad_norm is None:
    return adamw
  return optax.chain(optax.clip_by_global_norm(opts.max_grad_norm), adamw)


def learning_rate(opt_state: Any) -> Optional[jax.Array]:
  """The learning rate the last update applied (the injected hyperparameter), or None for an
  optimizer without one."""
  # The injected value, not the schedule's own state stored under the same name.
  return optax.tree_utils.tree_get(opt_state, "learning_rate",
                                   filtering=lambda _, value: isinstance(value, jax.Array))
