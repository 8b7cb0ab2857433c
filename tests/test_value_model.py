"""The critic's model (tirjax/models/value.py): a scalar head on a copy of the policy's trunk."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tirjax.loss.value import value_loss
from tirjax.models import config as model_config
from tirjax.models import decoder
from tirjax.models.value import ValueModel, from_policy


def policy():
  return decoder.init(model_config.tiny(vocab_size=64), seed=0)


def test_from_policy_copies_the_trunk_and_starts_at_zero():
  pol = policy()
  critic = from_policy(pol)
  tokens = jnp.array([[1, 5, 7, 9, 0], [2, 3, 0, 0, 0]])
  valid = tokens > 0
  v = critic.values(tokens, valid)
  assert v.shape == tokens.shape and not np.any(np.asarray(v))  # fresh head: V ≡ 0
  np.testing.assert_array_equal(critic.trunk.hidden(tokens, valid), pol.hidden(tokens, valid))
  # Separate arrays: moving the critic's trunk leaves the policy's alone.
  before = np.asarray(pol.embed[...]).copy()
  critic.trunk.embed[...] = critic.trunk.embed[...] + 1.0
  np.testing.assert_array_equal(pol.embed[...], before)


def test_values_read_the_hidden_state_before_each_token():
  """values[:, l] = head(hidden[:, l − 1]): the prefix before token l; 0 at l = 0 and on
  padding; a later token never changes an earlier value (causal)."""
  critic = from_policy(policy())
  critic.head_w[...] = jnp.linspace(-1, 1, critic.head_w.shape[0])
  critic.head_b[...] = jnp.asarray(0.3)
  tokens = jnp.array([[1, 5, 7, 9]])
  v = np.asarray(critic.values(tokens, tokens > 0))
  h = critic.head(critic.trunk.hidden(tokens, tokens > 0))
  np.testing.assert_allclose(v[0, 1:], np.asarray(h)[0, :-1], rtol=1e-6)
  assert v[0, 0] == 0
  other = np.asarray(critic.values(jnp.array([[1, 5, 7, 3]]), tokens > 0))
  np.testing.assert_allclose(other, v, rtol=1e-6)  # the last token is in no prefix read here


def test_the_value_loss_trains_the_head_and_trunk():
  """The zero head takes the first gradient alone (the trunk's passes through w = 0); once w
  is not 0 the trunk's gradient is not 0 either."""
  critic = from_policy(policy())
  tokens = jnp.array([[1, 5, 7, 9], [1, 5, 8, 2]])
  valid, mask = tokens > 0, jnp.array([[0, 1, 1, 1], [0, 1, 1, 1]], bool)
  target = jnp.where(mask, 1.0, 0.0)

  def loss(model):
    v = model.values(tokens, valid)
    return value_loss(v, jnp.zeros_like(v), target, mask, 0.2).loss.value

  def trunk_grad(grads):
    return sum(float(jnp.abs(g).sum()) for g in jax.tree.leaves(nnx.state(grads.trunk)))

  grads = nnx.grad(loss)(critic)
  assert float(jnp.abs(grads.head_b[...])) > 0 and float(jnp.abs(grads.head_w[...]).sum()) > 0
  assert trunk_grad(grads) == 0
  critic.head_w[...] = -0.1 * grads.head_w[...]
  assert trunk_grad(nnx.grad(loss)(critic)) > 0
  assert isinstance(critic, ValueModel)
