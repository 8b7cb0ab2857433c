"""Reference token log-probs and entropies: plain loops in float64 (values) and the dense JAX
computation over full `[B, L, V]` logits (for gradients by autodiff).

logprobs[b, i] = log softmax(W h[b, i-1] / τ)[tokens[b, i]] where tokens i-1 and i are both
                 valid (i ≥ 1), else 0;
entropy[b, i]  = −Σ_v p_v log p_v of that same distribution.
"""

import jax
import jax.numpy as jnp
import numpy as np


def loop_logprobs(hidden, unembedding, tokens, token_valid, temperature=1.0):
  h = np.asarray(hidden, np.float64)
  w = np.asarray(unembedding, np.float64)
  b_size, length = np.shape(tokens)
  logp = np.zeros((b_size, length))
  entropy = np.zeros((b_size, length))
  for b in range(b_size):
    for i in range(1, length):
      if not (token_valid[b][i] and token_valid[b][i - 1]):
        continue
      z = w @ h[b, i - 1] / temperature
      m = z.max()
      lse = m + np.log(np.sum(np.exp(z - m)))
      lp = z - lse
      logp[b, i] = lp[tokens[b][i]]
      entropy[b, i] = -np.sum(np.exp(lp) * lp)
  return logp, entropy


def dense_logprobs(hidden, unembedding, tokens, token_valid, temperature=1.0):
  """The naive computation: full float32 logits, log_softmax, gather."""
  z = jnp.einsum("bld,vd->blv", hidden, unembedding,
                 preferred_element_type=jnp.float32) / temperature
  lp = jax.nn.log_softmax(z[:, :-1], axis=-1)
  logp = jnp.take_along_axis(lp, tokens[:, 1:, None], axis=-1)[..., 0]
  entropy = -jnp.sum(jnp.exp(lp) * lp, axis=-1)
  token_valid = jnp.asarray(token_valid, bool)
  valid = jnp.pad(token_valid[:, 1:] & token_valid[:, :-1], ((0, 0), (1, 0)))
  pad = lambda x: jnp.where(valid, jnp.pad(x, ((0, 0), (1, 0))), 0.0)
  return pad(logp), pad(entropy)
