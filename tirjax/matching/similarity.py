"""Similarity of predicted to ground-truth tool calls, on device (HiDiffTIR Eq. 22-25).

  sim(c, c*) = 1[name = name*] · (1 + J(P, P*) + Σ_{k ∈ P*} 1[c[k] = c*[k]]) / (2 + |P*|)

with J the Jaccard index of the parameter-name sets (J(∅, ∅) = 1). Range {0} ∪ (0, 1].
Reference: Guo et al. 2026, HiDiffTIR, Appendix A.3; spec §4.2.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from tirjax.rollouts import CallEncoding


def pair_stats(enc: CallEncoding) -> dict:
  """Name equality, key-set sizes and value matches for every pair, [B, T, K, C] each."""
  chex.assert_rank([enc.pred_keys, enc.gt_keys], [4, 3])
  pk = enc.pred_keys[:, :, :, None, :, None]  # [B,T,K,1,P,1]
  gk = enc.gt_keys[:, None, None, :, None, :]  # [B,1,1,C,1,P]
  same_key = (pk == gk) & (pk >= 0)
  same_val = enc.pred_values[:, :, :, None, :, None] == enc.gt_values[:, None, None, :, None, :]
  inter = jnp.sum(same_key, axis=(-2, -1)).astype(jnp.float32)
  values = jnp.sum(same_key & same_val, axis=(-2, -1)).astype(jnp.float32)
  n_pred = jnp.sum(enc.pred_keys >= 0, axis=-1).astype(jnp.float32)[:, :, :, None]
  n_gt = jnp.sum(enc.gt_keys >= 0, axis=-1).astype(jnp.float32)[:, None, None, :]
  name = (enc.pred_name[:, :, :, None] == enc.gt_name[:, None, None, :]) & (
      enc.gt_name[:, None, None, :] >= 0)
  return dict(name=name, inter=inter, union=n_pred + n_gt - inter, values=values,
              n_pred=n_pred, n_gt=n_gt)


@jax.jit
def call_similarity(enc: CallEncoding, call_valid: jax.Array, gt_valid: jax.Array) -> jax.Array:
  """`call_sim` [B, T, K, C] from encoded calls; 0 where either side is padding."""
  s = pair_stats(enc)
  jaccard = jnp.where(s["union"] > 0, s["inter"] / jnp.maximum(s["union"], 1.0), 1.0)
  sim = s["name"] * (1.0 + jaccard + s["values"]) / (2.0 + s["n_gt"])
  valid = call_valid[..., None] & gt_valid[:, None, None, :]
  return jnp.where(valid, sim, 0.0).astype(jnp.float32)
