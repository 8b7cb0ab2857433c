"""The critic's jitted passes: its values of a rollout batch, and its update (issue 53).

    critic = Critic.build(graphdef, params, mesh, rules, CriticOptions(...), step_opts)
    cp, copt = critic.init(policy_params)                  # from the policy as RL starts
    rollouts = rollouts.replace(values=critic.values(cp, rollouts))    # before the estimator
    cp, copt, updates = critic.update(cp, copt, critic_batch(rollouts, adv), ...)

The value model is `tirjax.models.value.ValueModel`: a copy of the policy's trunk and a zero
head, placed by the same logical-axis rules on the same mesh (the head's weight has the axis
("embed",)). Its update is the generic `TrainStep` (gradient accumulation of a `Mean(sum,
den)` over micro-batches, clipping, AdamW) on the clipped value loss of `tirjax.loss.value`:

    g = Σ_m ∇ sum_m / max(Σ_m den_m, 1),   sum_m / den_m the aggregated ½·max((v−G)², (v_clip−G)²)

on the mini-batches and epochs of the policy's update (`minibatches.update_passes`, the same
shuffles). With `step.packed` (the default) both passes run on packed forests
(`tirjax.train_steps.critic_packed`): each query group a forest, every shared prefix (the
group's prompt, a tree's shared steps) computed once. The values pass fills the loss tokens
only (0 elsewhere; the estimators read no others), as the KL reference's log-probs are; the
update (`PackedValueStep`) computes the value-mask tokens' values and accumulates the same
(sum, den) over micro-batches by token budget, so its gradient is the padded one's. Without
`step.packed` both forward every `[B, L]` row whole.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from tirjax.checkpoint import TrainState
from tirjax.loss.value import value_loss
from tirjax.models.value import from_policy
from tirjax.rollouts import Advantages, Rollouts
from tirjax.train_steps.batches import merge_microbatches, split_microbatches
from tirjax.train_steps.critic_packed import PackedValues, PackedValueStep
from tirjax.train_steps.minibatches import update_passes
from tirjax.train_steps.optimizer import make_optimizer
from tirjax.train_steps.step import (LossFn, Placement, StepOptions, TrainStep, placed_copy,
                                     placement, split_model)


@flax.struct.dataclass(frozen=True)
class CriticBatch:
  """Inputs of the value loss, `[B, L]`."""

  tokens: jax.Array  # int32
  token_valid: jax.Array  # bool
  old_values: jax.Array  # f32, the values the advantages were computed with
  returns: jax.Array  # f32, the estimator's targets G (`extras["returns"]`)
  value_mask: jax.Array  # bool, the tokens the critic fits (`extras["value_mask"]`)


def critic_batch(rollouts: Rollouts, adv: Advantages) -> CriticBatch:
  """The critic's batch: the rollouts' tokens, and the targets and mask its estimator returned
  (`ppo`, `turn_ppo`: `extras["returns"]`, `extras["value_mask"]`, `extras["values"]`)."""
  missing = [k for k in ("returns", "value_mask", "values") if k not in (adv.extras or {})]
  if missing:
    raise ValueError(f"critic_batch: the estimator's output lacks extras {missing}; only an "
                     "estimator that reads values (needs=('values',)) gives a critic targets")
  mask = adv.extras["value_mask"] & rollouts.row_valid[:, None]
  return CriticBatch(tokens=rollouts.tokens, token_valid=rollouts.token_valid,
                     old_values=adv.extras["values"], returns=adv.extras["returns"],
                     value_mask=mask)


def value_loss_fn(cliprange_value: Optional[float], aggregation: str,
                  norm_constant: Optional[float]) -> LossFn:
  """The clipped value loss of a `CriticBatch` under the value model's predictions."""

  def loss_fn(model, mb: CriticBatch):
    vpreds = model.values(mb.tokens, mb.token_valid)
    out = value_loss(vpreds, mb.old_values, mb.returns, mb.value_mask, cliprange_value,
                     aggregation, norm_constant)
    counts = {"tokens/valid": jnp.sum(mb.token_valid, dtype=jnp.float32),
              "tokens/value": out.clipfrac.den,
              "tokens/forwarded": jnp.float32(mb.tokens.size)}
    return out.loss, {"loss": out.loss, "clipfrac": out.clipfrac, "error": out.error}, counts

  return loss_fn


def explained_variance(values: np.ndarray, returns: np.ndarray, mask: np.ndarray,
                       eps: float = 1e-5) -> float:
  """1 − Var(G − V) / (Var(G) + eps) over the masked tokens, of the values the advantages were
  computed with (verl's `vf_explained_var`, its eps 1e-5 too: a batch whose returns barely
  vary is not a huge negative number); 0 with fewer than 2 tokens."""
  mask = np.asarray(mask, bool)
  g, v = np.asarray(returns, np.float64)[mask], np.asarray(values, np.float64)[mask]
  if g.size < 2:
    return 0.0
  return float(1.0 - np.var(g - v) / (np.var(g) + eps))


class Critic:
  """The value model's graph, optimizer, placement, forward and update."""

  def __init__(self, graphdef: nnx.GraphDef, tx: optax.GradientTransformation,
               place: Placement, cliprange_value: Optional[float], aggregation: str,
               norm_constant: Optional[float], opts: StepOptions):
    self.graphdef, self.tx, self.placement = graphdef, tx, place
    loss = (cliprange_value, aggregation, norm_constant)
    self.step = (PackedValueStep(graphdef, tx, place, *loss, opts) if opts.packed else
                 TrainStep(graphdef, tx, value_loss_fn(*loss), place, opts.num_microbatches))

    def values(params, tokens, token_valid):
      model = nnx.merge(graphdef, params)
      mbs = split_microbatches((tokens, token_valid), opts.num_microbatches)
      return merge_microbatches(jax.lax.map(lambda mb: model.values(mb[0], mb[1]), mbs))

    self.jitted_values = jax.jit(values, in_shardings=(place.params, place.batch, place.batch),
                                 out_shardings=place.batch)
    self.packed = PackedValues(graphdef, place, opts) if opts.packed else None

  @property
  def packer(self):
    """The packed values pass's `Packer` (its sizes are resumable state); None when padded.
    The update's is `step.packer`."""
    return None if self.packed is None else self.packed.packer

  @classmethod
  def build(cls, policy_graphdef: nnx.GraphDef, policy_params: nnx.State, mesh, rules,
            critic: Any, loss_norm_constant: Optional[float],
            opts: StepOptions = StepOptions()) -> "Critic":
    """The critic of the policy `(policy_graphdef, policy_params)` (its architecture and
    sharding; the parameters themselves are `init`'s), with the optimizer and loss of `critic`
    (`tirjax.trainer.options.CriticOptions`, its aggregation resolved)."""
    graphdef, params = split_model(from_policy(nnx.merge(policy_graphdef, policy_params)))
    tx = make_optimizer(critic.optim)
    place = placement(params, tx, mesh, rules)
    del params
    return cls(graphdef, tx, place, critic.cliprange_value, critic.aggregation,
               loss_norm_constant, opts)

  def init(self, policy_graphdef: nnx.GraphDef, policy_params: nnx.State
           ) -> tuple[nnx.State, Any]:
    """(parameters, optimizer state): a trunk copied from `policy_params` and a zero head
    (`from_policy`), placed by the critic's shardings, with a fresh optimizer state."""
    _, params = split_model(from_policy(nnx.merge(policy_graphdef, policy_params)))
    params = placed_copy(params, self.placement.params)
    opt_state = jax.jit(self.tx.init, out_shardings=self.placement.opt_state)(params)
    return params, opt_state

  def values(self, params: nnx.State, rollouts: Rollouts) -> jax.Array:
    """[B, L] f32: V of the prefix before each token (`Rollouts.values`); packed: on the loss
    tokens only, 0 elsewhere."""
    if self.packed is not None:
      return jax.block_until_ready(self.packed(params, rollouts))
    tokens, valid = jax.device_put((rollouts.tokens, rollouts.token_valid),
                                   self.placement.batch)
    with jax.set_mesh(self.placement.mesh):
      return jax.block_until_ready(self.jitted_values(params, tokens, valid))

  def update(self, state: TrainState, batch: CriticBatch, group_id: np.ndarray,
             row_valid: np.ndarray, num_minibatches: int, epochs: int, *, seed: int,
             step: int) -> tuple[TrainState, list]:
    """`state` with its critic updated on `batch` (the policy's mini-batches and epochs: the
    same shuffles), and each update's metrics."""
    own = dataclasses.replace(state, params=state.critic_params,
                              opt_state=state.critic_opt_state, critic_params=None,
                              critic_opt_state=None)
    own, updates = update_passes(own, self.step, batch, group_id, row_valid, num_minibatches,
                                 epochs, seed=seed, step=step)
    return dataclasses.replace(state, critic_params=own.params,
                               critic_opt_state=own.opt_state), updates
