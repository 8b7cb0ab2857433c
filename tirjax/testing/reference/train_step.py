"""References for the train steps: the full-batch objectives without micro-batches or chunked
log-probs, AdamW with global-norm clipping and the learning-rate schedules in float64 numpy,
the SFT negative log-likelihood as a loop, and the decoder's parameter count by formula.
"""

import math

import jax
import numpy as np
from flax import nnx

from tirjax.testing.reference.model_logprobs import dense_logprobs
from tirjax.loss import policy_loss


def full_batch_policy_objective(graphdef, params, batch, loss_opts, temperature=1.0):
  """`policy_loss(...).loss.value` of the whole batch, log-probs from full `[B, L, V]` logits."""
  model = nnx.merge(graphdef, params)
  hidden = model.hidden(batch.tokens, batch.token_valid)
  logp, entropy = dense_logprobs(hidden, model.unembedding, batch.tokens, batch.token_valid,
                                 temperature)
  out = policy_loss(logp, batch.old_logprobs, batch.advantages, batch.loss_mask, batch.row_mask,
                    loss_opts, ref_logprobs=batch.ref_logprobs,
                    entropy=entropy if loss_opts.entropy_coef > 0 else None,
                    sampler_logprobs=getattr(batch, "sampler_logprobs", None))
  return out.loss.value


def full_batch_step(graphdef, params, opt_state, tx, objective):
  """(loss, grads, new params, new optimizer state) of one update on `objective(params)`."""
  loss, grads = jax.value_and_grad(objective)(params)
  updates, opt_state = tx.update(grads, opt_state, params)
  new = jax.tree.map(lambda p, u: p + u, params, updates)
  return loss, grads, new, opt_state


def schedule(n, *, learning_rate, schedule, warmup_steps, decay_steps, final_lr_fraction):
  """η(n): linear warmup (n+1)/(W+1), then constant or cosine down to f·η over D steps."""
  if n < warmup_steps:
    return learning_rate * (n + 1) / (warmup_steps + 1)
  if schedule == "constant":
    return learning_rate
  progress = min(n - warmup_steps, decay_steps) / decay_steps
  f = final_lr_fraction
  return learning_rate * (f + (1 - f) * 0.5 * (1 + math.cos(math.pi * progress)))


def adamw_steps(params, grads_seq, *, lrs, b1, b2, eps, weight_decay, max_grad_norm):
  """Parameters after clipped AdamW updates (Loshchilov & Hutter 2019; Adam's bias
  correction; decay decoupled and scaled by the rate), one list of arrays per step."""
  p = [np.asarray(x, np.float64) for x in params]
  m = [np.zeros_like(x) for x in p]
  v = [np.zeros_like(x) for x in p]
  out = []
  for t, (grads, lr) in enumerate(zip(grads_seq, lrs), start=1):
    g = [np.asarray(x, np.float64) for x in grads]
    norm = math.sqrt(sum(float(np.sum(x * x)) for x in g))
    if max_grad_norm is not None and norm > max_grad_norm:
      g = [x * max_grad_norm / norm for x in g]
    for i in range(len(p)):
      m[i] = b1 * m[i] + (1 - b1) * g[i]
      v[i] = b2 * v[i] + (1 - b2) * g[i] ** 2
      m_hat = m[i] / (1 - b1 ** t)
      v_hat = v[i] / (1 - b2 ** t)
      p[i] = p[i] - lr * (m_hat / (np.sqrt(v_hat) + eps) + weight_decay * p[i])
    out.append([x.copy() for x in p])
  return out


def sft_nll(logits, tokens, token_valid, loss_mask):
  """Token-mean −log p over positions i ≥ 1 with loss_mask[i] and tokens i−1, i valid, from
  logits `[B, L, V]` (position i−1 predicts token i), in float64; 0 with no such position."""
  z = np.asarray(logits, np.float64)
  total, count = 0.0, 0
  for b in range(z.shape[0]):
    for i in range(1, z.shape[1]):
      if loss_mask[b][i] and token_valid[b][i] and token_valid[b][i - 1]:
        row = z[b, i - 1]
        lse = row.max() + math.log(np.sum(np.exp(row - row.max())))
        total -= row[tokens[b][i]] - lse
        count += 1
  return total / count if count else 0.0


def decoder_params(cfg):
  """Parameter count of the decoder from the architecture (Qwen3 / Qwen2 / Llama layout)."""
  d, f, h, kv, hd = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                     cfg.head_dim)
  attn = d * h * hd + 2 * d * kv * hd + h * hd * d
  if cfg.family == "qwen2":
    attn += h * hd + 2 * kv * hd
  if cfg.family == "qwen3":
    attn += 2 * hd
  layer = attn + 3 * d * f + 2 * d
  embeddings = cfg.vocab_size * d * (1 if cfg.tie_word_embeddings else 2)
  return cfg.num_layers * layer + d + embeddings


def flatten(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]
