"""The critic's jitted passes (tirjax/train_steps/critic.py, issue 53): its packed values equal
its padded ones on the loss tokens of trees, independent groups and padding rows; its update
fits the returns and never touches the policy."""

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tirjax import advantages, sharding, train_steps
from tirjax.rollouts import Advantages
from tirjax.testing import strategies, train_setup as ts
from tirjax.train_steps.critic import Critic, critic_batch, explained_variance

PADDED = train_steps.StepOptions(logprob_chunk_size=32)
PACKED = dataclasses.replace(PADDED, packed=True, attention_block=8,
                             max_tokens_per_microbatch=48)
CRITIC = types.SimpleNamespace(
    optim=train_steps.OptimizerOptions(learning_rate=3e-3, weight_decay=0.0),
    cliprange_value=None, aggregation="token_mean")


def mixed_rollouts(seed):
  """Trees, independent groups, an irregular tree and padding rows (as the packed update's
  tests), tool responses inside rows."""
  return strategies.mixed_rollouts(np.random.default_rng(seed), num_rows=32, prompt_tokens=7,
                                   step_tokens=3, response_tokens=2, vocab_size=ts.VOCAB)


def critic_and_params(opts, seed=0, random_head=True):
  graphdef, params, *_ = ts.setup()
  critic = Critic.build(graphdef, params, ts.mesh((1, 1, 1)), sharding.DEFAULT_RULES, CRITIC,
                        None, opts)
  cp, copt = critic.init(graphdef, params)
  if not random_head:  # as RL starts: V = 0
    return critic, cp, copt, graphdef, params
  # a head that is not zero, so that values differ by position and row
  rng = np.random.default_rng(seed)
  cp["head_w"].value = jnp.asarray(rng.standard_normal(cp["head_w"].value.shape), jnp.float32)
  cp["head_b"].value = jnp.asarray(0.25, jnp.float32)
  return critic, cp, copt, graphdef, params


@pytest.mark.parametrize("seed", [0, 1])
def test_packed_values_equal_the_padded_ones_on_the_loss_tokens(seed):
  r = mixed_rollouts(seed)
  padded, cp, *_ = critic_and_params(PADDED)
  packed, *_ = critic_and_params(PACKED)
  want = np.asarray(padded.values(cp, r))
  got = np.asarray(packed.values(cp, r))
  live = np.array(r.loss_mask & r.token_valid)
  live[:, 0] = False
  assert live.sum() > 100 and np.abs(want[live]).max() > 0.1  # values that vary
  np.testing.assert_allclose(got[live], want[live], rtol=1e-5, atol=1e-5)
  assert not got[~live].any()  # packed: the loss tokens only
  assert packed.packer is not None and padded.packer is None


def test_the_update_fits_the_returns_and_leaves_the_policy_alone():
  r = mixed_rollouts(0)
  critic, cp, copt, graphdef, params = critic_and_params(PADDED, random_head=False)
  r = r.replace(values=critic.values(cp, r))
  spec = advantages.get("ppo")
  adv = spec(r, spec.make_options({}))
  batch = critic_batch(r, adv)
  policy_before = jax.tree.map(np.asarray, params)
  state = train_steps.init_state(params, ts.optimizer(), ts.setup()[3], jax.random.key(0))
  state = dataclasses.replace(state, critic_params=cp, critic_opt_state=copt)
  group_id, row_valid = np.asarray(r.group_id), np.asarray(r.row_valid)
  losses = []
  for step in range(8):
    state, updates = critic.update(state, batch, group_id, row_valid, 2, 1, seed=0, step=step)
    assert len(updates) == 2 and all(np.isfinite(float(u["loss"])) for u in updates)
    losses.append(np.mean([float(u["loss"]) for u in updates]))
  assert losses[-1] < 0.5 * losses[0], losses
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(policy_before)):
    np.testing.assert_array_equal(np.asarray(a), b)
  fitted = np.asarray(critic.values(state.critic_params, r))
  mask = np.asarray(batch.value_mask)
  returns = np.asarray(batch.returns)
  error = lambda v: np.mean((v - returns)[mask] ** 2)
  assert error(fitted) < 0.5 * error(np.asarray(batch.old_values))  # closer to G than V = 0
  assert explained_variance(fitted, np.asarray(batch.returns), mask) > explained_variance(
      np.asarray(batch.old_values), np.asarray(batch.returns), mask)


def test_critic_batch_needs_an_estimator_that_gives_targets():
  r = mixed_rollouts(0)
  adv = advantages.get("grpo")(r)
  with pytest.raises(ValueError, match="lacks extras"):
    critic_batch(r, adv)
  assert isinstance(adv, Advantages)


def test_explained_variance_limits():
  g = np.array([[1.0, 2.0, 3.0, 4.0]])
  mask = np.ones_like(g, bool)
  assert explained_variance(g, g, mask) == pytest.approx(1.0, abs=1e-4)
  assert explained_variance(np.zeros_like(g), g, mask) == pytest.approx(0.0, abs=1e-4)
  assert explained_variance(g, g, np.zeros_like(mask)) == 0.0
