"""A small softmax policy over the chain task's actions: an MLP on a one-hot state encoding.

The state space is tiny ((D + 1) · T_max states), so the policy is evaluated on every state at
once: `log_policy(params, features, prior)` is the [S, A] table of log π(a | s) that the
sampler, the loss and the exact evaluation all read. Logits are a fixed prior plus the MLP,
whose output layer starts at zero, so the initial policy is the prior: a warm start that puts
probability `warm_start` on the optimal action of every state and spreads the rest uniformly
(the SFT stage of an LLM agent; 1/A gives the uniform policy). `hidden=()` makes the trained
part a linear function of the encoding.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from tirjax import option_checks
from tirjax.credit.task import ChainTask


@dataclasses.dataclass(frozen=True)
class PolicyOptions:
  """Attributes:
    hidden: widths of the hidden tanh layers (empty: linear in the encoding).
    warm_start: initial probability of each state's optimal action (1/A: uniform).
  """

  hidden: tuple[int, ...] = (32,)
  warm_start: float = 0.35

  def __post_init__(self):
    for i, width in enumerate(self.hidden):
      option_checks.int_at_least(f"hidden[{i}]", width, 1)
    option_checks.lies_in("warm_start", self.warm_start, 0, 1, open_low=True, open_high=True)


def state_features(task: ChainTask) -> np.ndarray:
  """[S, D + 1 + T_max] f32: one-hot progress k ⊕ one-hot step t of state k · T_max + t."""
  k, t = np.divmod(np.arange(task.num_states), task.max_steps)
  return np.concatenate([np.eye(task.num_progress)[k], np.eye(task.max_steps)[t]],
                        axis=1).astype(np.float32)


def prior_logits(task: ChainTask, opts: PolicyOptions) -> np.ndarray:
  """[S, A] f32 fixed logits: softmax gives `warm_start` to the optimal action of each state.

  With q = warm_start and A actions, the optimal action's logit is log(q (A − 1) / (1 − q))
  and every other action's is 0.
  """
  q, A = opts.warm_start, task.num_actions
  k = np.arange(task.num_states) // task.max_steps
  out = np.zeros((task.num_states, A), np.float32)
  out[np.arange(task.num_states), task.optimal_action()[k]] = np.log(q * (A - 1) / (1 - q))
  return out


def init_policy(key: jax.Array, task: ChainTask, opts: PolicyOptions) -> list[dict]:
  """MLP parameters: LeCun-normal hidden layers, a zero output layer (uniform start)."""
  sizes = [task.num_progress + task.max_steps, *opts.hidden]
  params = []
  for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
    key, sub = jax.random.split(key)
    params.append({"w": jax.random.normal(sub, (fan_in, fan_out)) / np.sqrt(fan_in),
                   "b": jnp.zeros(fan_out)})
  params.append({"w": jnp.zeros((sizes[-1], task.num_actions)), "b": jnp.zeros(task.num_actions)})
  return params


def log_policy(params: list[dict], features: jax.Array, prior: jax.Array) -> jax.Array:
  """[S, A] log π(a | s) = log_softmax(prior + MLP(features)) for every state."""
  x = features
  for layer in params[:-1]:
    x = jnp.tanh(x @ layer["w"] + layer["b"])
  return jax.nn.log_softmax(prior + x @ params[-1]["w"] + params[-1]["b"], axis=-1)
