"""Token log-probs and entropies of a `[B, L]` batch without `[B, L, V]` float32 logits.

For hidden states h (the decoder's final, normalised ones), unembedding W `[V, D]` and
temperature τ, the logits of position n are z_n = W h_n / τ, and

  log p(t_n) = z_n[t_n] − lse(z_n),        H_n = −Σ_v p_nv log p_nv.

Rows are processed `chunk_size` at a time, forward and backward (a `jax.custom_vjp` that
saves only lse and H and recomputes each chunk's logits), so peak memory holds one
`[chunk_size, V]` block. The backward pass uses

  ∂ log p(t_n)/∂z_n = e_{t_n} − p_n,       ∂H_n/∂z_n = −p_n ⊙ (log p_n + H_n),

and ∂z/∂h = W/τ, ∂z/∂W = h/τ.
"""

from __future__ import annotations

import functools
from typing import Optional

import chex
import jax
import jax.numpy as jnp


def _chunk_logits(h, w, inv_temp):
  return jnp.einsum("nd,vd->nv", h, w, preferred_element_type=jnp.float32) * inv_temp


def _chunk_forward(h, w, t, inv_temp, with_entropy):
  z = _chunk_logits(h, w, inv_temp)
  lse = jax.nn.logsumexp(z, axis=-1)
  logp = jnp.take_along_axis(z, t[:, None], axis=-1)[:, 0] - lse
  if not with_entropy:
    return logp, jnp.zeros_like(lse), lse
  logp_all = z - lse[:, None]
  return logp, -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1), lse


def _split(x, chunk):
  return x.reshape((x.shape[0] // chunk, chunk) + x.shape[1:])


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _rows(h, w, t, inv_temp: float, chunk: int, with_entropy: bool):
  """(log p(t_n), H_n or 0) for rows h `[N, D]` (N a multiple of `chunk`), targets t `[N]`."""
  return _rows_fwd(h, w, t, inv_temp, chunk, with_entropy)[0]


def _rows_fwd(h, w, t, inv_temp, chunk, with_entropy):
  out = jax.lax.map(lambda a: _chunk_forward(a[0], w, a[1], inv_temp, with_entropy),
                    (_split(h, chunk), _split(t, chunk)))
  logp, entropy, lse = (x.reshape(-1) for x in out)
  return (logp, entropy), (h, w, t, lse, entropy)


def _rows_bwd(inv_temp, chunk, with_entropy, res, cotangents):
  h, w, t, lse, entropy = res
  g_logp, g_entropy = cotangents

  def step(dw, a):
    h_c, t_c, lse_c, ent_c, gl_c, ge_c = a
    logp = _chunk_logits(h_c, w, inv_temp) - lse_c[:, None]
    p = jnp.exp(logp)
    if with_entropy:
      dz = -p * (gl_c[:, None] + ge_c[:, None] * (logp + ent_c[:, None]))
    else:
      dz = -p * gl_c[:, None]
    dz = dz.at[jnp.arange(chunk), t_c].add(gl_c) * inv_temp
    dh = jnp.einsum("nv,vd->nd", dz, w.astype(jnp.float32))
    dw = dw + jnp.einsum("nv,nd->vd", dz, h_c.astype(jnp.float32))
    return dw, dh.astype(h.dtype)

  parts = tuple(_split(x, chunk) for x in (h, t, lse, entropy, g_logp, g_entropy))
  dw, dh = jax.lax.scan(step, jnp.zeros(w.shape, jnp.float32), parts)
  return dh.reshape(h.shape), dw.astype(w.dtype), None


_rows.defvjp(_rows_fwd, _rows_bwd)


def _check(chunk_size: int, temperature: float) -> None:
  if chunk_size < 1:
    raise ValueError(f"chunk_size: must be >= 1, got {chunk_size}")
  if not temperature > 0:
    raise ValueError(f"temperature: must be > 0, got {temperature}")


def _flat(h, w, t, chunk_size, temperature, with_entropy):
  """(log p(t_n), H_n) of hidden states h `[n, D]` and targets t `[n]`, chunked."""
  n = h.shape[0]
  chunk = min(chunk_size, max(n, 1))
  pad = -n % chunk
  logp, entropy = _rows(jnp.pad(h, ((0, pad), (0, 0))), w,
                        jnp.pad(t.astype(jnp.int32), (0, pad)), 1.0 / temperature, chunk,
                        with_entropy)
  return logp[:n], entropy[:n]


def logprobs_from_hidden(hidden: jax.Array, unembedding: jax.Array, tokens: jax.Array,
                         token_valid: jax.Array, *, chunk_size: int,
                         temperature: float = 1.0, with_entropy: bool = False
                         ) -> tuple[jax.Array, Optional[jax.Array]]:
  """Log-probs `[B, L]` of `tokens` under hidden states `[B, L, D]` and unembedding `[V, D]`.

  `logprobs[b, i] = log p(tokens[b, i] | tokens[b, :i])`, read from the hidden state at i − 1;
  0 at i = 0 and unless tokens i − 1 and i are both valid (for right-padded rows: on
  padding). `entropy[b, i]` is the entropy of that same distribution (None unless
  `with_entropy`). `chunk_size` rows of logits at a time.
  """
  chex.assert_rank(hidden, 3)
  chex.assert_equal_shape([tokens, token_valid])
  chex.assert_equal_shape_prefix([hidden, tokens], 2)
  _check(chunk_size, temperature)
  b, l, d = hidden.shape
  n = b * (l - 1)
  targets = jnp.where(jnp.asarray(token_valid, bool), tokens, 0)[:, 1:]  # any padding ids
  logp, entropy = _flat(hidden[:, :-1].reshape(n, d), unembedding, targets.reshape(n),
                        chunk_size, temperature, with_entropy)
  token_valid = jnp.asarray(token_valid, bool)
  valid = jnp.pad(token_valid[:, 1:] & token_valid[:, :-1], ((0, 0), (1, 0)))

  def to_rows(x):
    x = jnp.concatenate([jnp.zeros((b, 1), x.dtype), x.reshape(b, l - 1)], axis=1)
    return jnp.where(valid, x, 0.0)

  return to_rows(logp), (to_rows(entropy) if with_entropy else None)


def packed_logprobs(hidden: jax.Array, unembedding: jax.Array, tokens: jax.Array,
                    prev: jax.Array, targets: jax.Array, *, chunk_size: int,
                    temperature: float = 1.0, with_entropy: bool = False
                    ) -> tuple[jax.Array, Optional[jax.Array]]:
  """Log-probs `[S, Q]` of the packed tokens `targets [S, Q]` (indices into `tokens [S, N]`;
  -1: none), each predicted from the hidden state of the token before it on its path,
  `prev[i]` (-1 for a root, whose log-prob and entropy are 0); see
  `tirjax.models.tree_attention`. Only the targets' `[Q, vocab]` logits are computed."""
  chex.assert_rank([hidden, targets], [3, 2])
  chex.assert_equal_shape([tokens, prev])
  chex.assert_equal_shape_prefix([hidden, tokens, targets], 1)
  _check(chunk_size, temperature)
  s, q = targets.shape
  take = jax.vmap(lambda x, i: x[i])  # per sequence
  index = jnp.maximum(targets, 0)
  before = take(prev, index)
  has_prev = (targets >= 0) & (before >= 0)
  h = take(hidden, jnp.maximum(before, 0))
  logp, entropy = _flat(h.reshape(s * q, -1), unembedding,
                        jnp.where(has_prev, take(tokens, index), 0).reshape(s * q),
                        chunk_size, temperature, with_entropy)
  shape = lambda x: jnp.where(has_prev, x.reshape(s, q), 0.0)
  return shape(logp), (shape(entropy) if with_entropy else None)


def token_logprobs(model, tokens: jax.Array, token_valid: jax.Array, *, chunk_size: int,
                   temperature: float = 1.0, with_entropy: bool = False
                   ) -> tuple[jax.Array, Optional[jax.Array]]:
  """Per-token log-probs (and entropies) of a `Decoder` on right-padded rows.

  Aligned with `Rollouts.tokens` / `old_logprobs`: `logprobs[b, i]` is
  log p(tokens[b, i] | tokens[b, :i]), 0 at position 0 and on padding.
  """
  hidden = model.hidden(tokens, token_valid)
  return logprobs_from_hidden(hidden, model.unembedding, tokens, token_valid,
                              chunk_size=chunk_size, temperature=temperature,
                              with_entropy=with_entropy)
