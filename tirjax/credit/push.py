"""Where one update pushes the policy: the first-order change of log π(a | s) per state.

The bench's policy is an MLP over state features, but what the loss asks of it is clearest in
the logits: with z [S, A] the logits and L the batch loss `sum / den` of `policy_loss` at the
behaviour policy, one gradient step of size η on z changes

    Δ log π(a | s) ≈ −η Σ_b (δ_ab − π(b | s)) ∂L/∂z_sb

(the Jacobian of log_softmax). `logit_push` returns that change per unit η for every state and
action; averaged over many batches sampled from one policy it is the expected push of a cell
(estimator × rollout kind × loss aggregation), which separates what the estimator's advantages
ask for from how the rollout sampler and the loss weigh the rows that carry them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tirjax.loss import LossOptions, policy_loss


def logit_push(logits: jax.Array, states: jax.Array, rollouts, token_adv: jax.Array,
               row_mask: jax.Array, loss: LossOptions) -> jax.Array:
  """[S, A] first-order Δ log π(a | s) of one gradient step of unit size on the logits.

  Args:
    logits: [S, A] the behaviour policy's logits (its log-probs are `old_logprobs`).
    states: [B, L] int policy state of each token.
    rollouts: the batch (`tokens`, `old_logprobs`, `loss_mask`).
    token_adv: [B, L] advantages.
    row_mask: [B] rows in the loss.
    loss: the loss options (aggregation, clipping).
  """
  def objective(z):
    table = jax.nn.log_softmax(z, axis=-1)
    out = policy_loss(table[states, rollouts.tokens], rollouts.old_logprobs, token_adv,
                      rollouts.loss_mask, row_mask, loss)
    return out.loss.sum / jnp.maximum(out.loss.den, 1.0)

  grad = jax.grad(objective)(logits)
  probs = jax.nn.softmax(logits, axis=-1)
  # Σ_b (δ_ab − π_b) g_b = g_a − Σ_b π_b g_b; the step is −g.
  return -(grad - jnp.sum(probs * grad, axis=-1, keepdims=True))
