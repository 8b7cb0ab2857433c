"""Similarity of predicted to ground-truth tool calls, on device (HiDiffTIR Eq. 22-25).

  sim(c, c*) = 1[name = name*] · (1 + J(P, P*) + Σ_{k ∈ P*} 1[c[k] = c*[k]]) / (2 + |P*|)

with J the Jaccard index of the parameter-name sets (J(∅, ∅) = 1). Range {0} ∪ (0, 1].
Reference: Guo et al. 2026, HiDiffTIR, Appendix A.3; spec §4.2.

The strict variant (`strict_call_similarity`, issue 51; not in the paper) scores 0 where a
direction parameter of the ground-truth call (compare's mode, convert's units, ...: the
environment says which, `encoding.direction_slots`) is missing from the predicted call or
differs in value, so that a call that took the wrong direction counts as unmatched rather than
as a near-match (a flipped compare otherwise keeps 3/4):

  sim_strict(c, c*) = sim(c, c*) · Π_{k ∈ D(c*)} 1[k ∈ P and c[k] = c*[k]]
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


def direction_agreement(enc: CallEncoding, gt_direction: jax.Array) -> jax.Array:
  """[B, T, K, C] bool: each direction parameter of ground-truth call c (`gt_direction`
  [B, C, P], its parameter slots that take a direction) appears in the predicted call with
  the same value; true for a ground-truth call without one."""
  chex.assert_rank([enc.pred_keys, enc.gt_keys, gt_direction], [4, 3, 3])
  chex.assert_equal_shape([enc.gt_keys, gt_direction])
  pk = enc.pred_keys[:, :, :, None, :, None]  # [B,T,K,1,P,1]
  gk = enc.gt_keys[:, None, None, :, None, :]  # [B,1,1,C,1,P]
  same_val = enc.pred_values[:, :, :, None, :, None] == enc.gt_values[:, None, None, :, None, :]
  found = jnp.any((pk == gk) & (pk >= 0) & same_val, axis=-2)  # [B,T,K,C,P] per gt slot
  return jnp.all(found | ~gt_direction[:, None, None, :, :], axis=-1)


@jax.jit
def strict_call_similarity(enc: CallEncoding, call_valid: jax.Array, gt_valid: jax.Array,
                           gt_direction: jax.Array) -> jax.Array:
  """`call_sim` [B, T, K, C] with 0 for a pair whose directions differ (the module docstring)."""
  sim = call_similarity(enc, call_valid, gt_valid)
  return jnp.where(direction_agreement(enc, gt_direction), sim, 0.0).astype(jnp.float32)
