"""`tirjax.credit.push.logit_push` against plain loops over tokens, and against a real step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tirjax import advantages
from tirjax.credit import chain_rollouts
from tirjax.credit.push import logit_push
from tirjax.credit.task import ChainTask
from tirjax.loss import LossOptions
from tirjax.testing.chain_tasks import random_policy


def reference_push(log_probs, states, tokens, mask, adv, aggregation):
  """Σ over tokens of w_t A_t (δ_{a a_t} − π(a | s_t)) per state: the policy-gradient term
  at ratio 1 (the clip is inactive there), with w_t the aggregation's token weight, pushed
  through the log-softmax Jacobian once more (Δ log π = J Jᵀ applied to w A)."""
  probs = np.exp(log_probs)
  S, A = log_probs.shape
  B, L = tokens.shape
  grad = np.zeros((S, A))  # ∂L/∂z
  total = mask.sum()
  for b in range(B):
    n = mask[b].sum()
    for t in range(L):
      if not mask[b, t]:
        continue
      w = 1.0 / total if aggregation == "token_mean" else 1.0 / (n * B)
      s, a = states[b, t], tokens[b, t]
      onehot = np.eye(A)[a]
      grad[s] += -w * adv[b, t] * (onehot - probs[s])
  push = np.zeros((S, A))
  for s in range(S):
    for a in range(A):
      push[s, a] = -sum(((a == c) - probs[s, c]) * grad[s, c] for c in range(A))
  return push


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "token_mean"])
@pytest.mark.parametrize("kind", chain_rollouts.KINDS)
def test_push_matches_loops_and_a_small_logit_step(aggregation, kind):
  task = ChainTask()
  rng = np.random.default_rng(3)
  log_probs = np.log(random_policy(rng, task, 0.7)).astype(np.float32)
  opts = chain_rollouts.ChainRolloutOptions(kind=kind, group_size=6, num_queries=3)
  batch = chain_rollouts.sample_batch(rng, task, log_probs, opts)
  r = batch.rollouts
  adv = advantages.get("portool")(r, advantages.get("portool").make_options({}))
  loss = LossOptions(aggregation=aggregation)
  push = np.asarray(logit_push(jnp.asarray(log_probs), batch.states, r, adv.tokens,
                               adv.row_mask, loss))
  want = reference_push(log_probs.astype(np.float64), np.asarray(batch.states),
                        np.asarray(r.tokens), np.asarray(r.loss_mask), np.asarray(adv.tokens),
                        aggregation)
  assert np.abs(want).max() > 1e-3  # the batch pushes somewhere
  np.testing.assert_allclose(push, want, atol=1e-5)

  # A real gradient step of size η on the logits moves log π by η · push to first order.
  eta = 1e-3

  def objective(z):
    from tirjax.loss import policy_loss
    table = jax.nn.log_softmax(z, axis=-1)
    out = policy_loss(table[batch.states, r.tokens], r.old_logprobs, adv.tokens, r.loss_mask,
                      adv.row_mask, loss)
    return out.loss.sum / jnp.maximum(out.loss.den, 1.0)

  z = jnp.asarray(log_probs, jnp.float64) if jax.config.jax_enable_x64 else jnp.asarray(log_probs)
  stepped = z - eta * jax.grad(objective)(z)
  moved = np.asarray(jax.nn.log_softmax(stepped, -1) - jax.nn.log_softmax(z, -1)) / eta
  np.testing.assert_allclose(moved, push, atol=2e-2 * np.abs(push).max() + 1e-4)


def test_push_is_zero_without_advantages():
  task = ChainTask()
  rng = np.random.default_rng(0)
  log_probs = np.log(random_policy(rng, task, 0.5)).astype(np.float32)
  batch = chain_rollouts.sample_batch(rng, task, log_probs, chain_rollouts.ChainRolloutOptions(num_queries=2))
  r = batch.rollouts
  zeros = jnp.zeros_like(r.old_logprobs)
  push = logit_push(jnp.asarray(log_probs), batch.states, r, zeros, r.row_valid, LossOptions())
  assert np.all(np.isfinite(push)) and np.abs(np.asarray(push)).max() == 0.0
