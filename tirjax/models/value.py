"""The critic: a scalar value head on the policy's decoder architecture (issue 53, item 1).

`ValueModel` is a `Decoder` trunk (the policy's config, its own parameters) and a fresh
scalar head w · h + b on the final normalised hidden state. `from_policy` builds it from the
warm start: the trunk's parameters are copies of the policy's (separate arrays: updating one
never moves the other), the head is zero, so the first values are all 0 (V ≡ 0: GAE then
starts from Monte Carlo returns). The head's weight carries the logical axis ("embed",), so
the same sharding rules place it. Why separate parameters and not a shared trunk (verl's
default too): the critic's regression gradient then never moves the policy, `critic_warmup`
steps train the critic alone, and each has its own optimizer and learning rate; the cost is
a second forward and backward of the trunk.

Convention (`Rollouts.values`): `values[b, l]` is V of the prefix tokens[b, :l], read off the
hidden state at l − 1 (the state in which token l is chosen); position 0 has no prefix and
gets 0 (it is always a prompt token, never a loss token).

Not yet integrated (see the issue's report): the trainer, its Orbax state, the packed update.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from tirjax.models.config import ModelConfig
from tirjax.models.decoder import Decoder
from tirjax.models.layers import param
from tirjax.sharding import DEFAULT_RULES, Rules


class ValueModel(nnx.Module):
  """A `Decoder` trunk and a scalar head: `values(tokens, token_valid) -> [B, L] f32`."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, rules: Rules = DEFAULT_RULES,
               trunk: Optional[Decoder] = None):
    self.trunk = trunk if trunk is not None else Decoder(config, rngs=rngs, rules=rules)
    self.head_w = param(jnp.zeros((config.hidden_size,), config.param_dtype), ("embed",))
    self.head_b = param(jnp.zeros((), config.param_dtype), ())

  def head(self, hidden: jax.Array) -> jax.Array:
    """float32 w · h + b of hidden states [..., hidden_size]."""
    w = self.head_w[...].astype(jnp.float32)
    return jnp.einsum("...d,d->...", hidden.astype(jnp.float32), w) + self.head_b[...]

  def values(self, tokens: jax.Array, token_valid: Optional[jax.Array] = None) -> jax.Array:
    """[B, L] f32: V of the prefix before each token (0 at position 0 and on padding)."""
    v = self.head(self.trunk.hidden(tokens, token_valid))  # V of the prefix through l
    shifted = jnp.concatenate([jnp.zeros_like(v[:, :1]), v[:, :-1]], axis=1)
    if token_valid is not None:
      shifted = jnp.where(token_valid, shifted, 0.0)
    return shifted


def from_policy(policy: Decoder) -> ValueModel:
  """A critic whose trunk is a copy of `policy`'s parameters and whose head is fresh (0)."""
  graphdef, state = nnx.split(policy)
  trunk = nnx.merge(graphdef, jax.tree.map(jnp.copy, state))
  return ValueModel(policy.config, rngs=nnx.Rngs(0), rules=policy.rules, trunk=trunk)
