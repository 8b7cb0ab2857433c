"""Decoder layer pieces: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU.

Written to match the Hugging Face PyTorch modules (`modeling_qwen3.py`, `modeling_qwen2.py`,
`modeling_llama.py`) operation by operation, so float32 logits agree to ~1e-5.
Projection kernels are stored input-dimensions first: q `[embed, heads, head_dim]`,
o `[heads, head_dim, embed]`, gate/up `[embed, mlp]`, down `[mlp, embed]`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tirjax.models.config import ModelConfig
from tirjax.models.tree_attention import TreeMask
from tirjax.sharding import Rules, constrain

# Masked attention scores; finite so that a row without any valid key gives a uniform
# distribution instead of NaN.
_MASKED = -1e30


def param(value, names) -> nnx.Param:
  """A parameter annotated with logical axis names (resolved later by `tirjax.sharding`)."""
  return nnx.Param(value, out_sharding=tuple(names), eager_sharding=False)


def normal(rngs: nnx.Rngs, cfg: ModelConfig, shape, names) -> nnx.Param:
  return param(cfg.init_std * jax.random.normal(rngs.params(), shape, cfg.param_dtype), names)


class RMSNorm(nnx.Module):
  """y = scale · x / sqrt(mean(x²) + eps), statistics in float32 (Zhang & Sennrich 2019)."""

  def __init__(self, dim: int, eps: float, names: tuple[str], param_dtype: str):
    self.scale = param(jnp.ones((dim,), param_dtype), names)
    self.eps = eps

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return self.scale[...].astype(x.dtype) * y.astype(x.dtype)


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
  """θ_i = base^(−2i/d), i < d/2, with Llama 3.1 scaling when configured.

  Llama 3.1 (HF `_compute_llama3_parameters`): wavelengths λ = 2π/θ longer than
  L_orig/low_freq_factor are divided by `factor`, shorter than L_orig/high_freq_factor kept,
  and in between interpolated with s = (L_orig/λ − low) / (high − low):
  θ' = (1 − s)·θ/factor + s·θ.
  """
  d = cfg.head_dim
  inv = 1.0 / (cfg.rope_theta ** (np.arange(0, d, 2, dtype=np.float32) / d))
  r = cfg.rope_scaling
  if r is None:
    return inv.astype(np.float32)
  old = r.original_max_position_embeddings
  wavelen = 2 * math.pi / inv
  scaled = np.where(wavelen > old / r.low_freq_factor, inv / r.factor, inv)
  s = (old / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor)
  smoothed = (1 - s) * scaled / r.factor + s * scaled
  medium = (wavelen >= old / r.high_freq_factor) & (wavelen <= old / r.low_freq_factor)
  return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_tables(cfg: ModelConfig, positions: jax.Array, dtype) -> tuple[jax.Array, jax.Array]:
  """cos, sin `[B, L, head_dim]` for integer positions `[B, L]` (halves repeated, as HF)."""
  angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(rope_inv_freq(cfg))
  angles = jnp.concatenate([angles, angles], axis=-1)
  return jnp.cos(angles).astype(dtype), jnp.sin(angles).astype(dtype)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """x·cos + rotate_half(x)·sin over the last axis; x `[B, L, N, head_dim]`."""
  x1, x2 = jnp.split(x, 2, axis=-1)
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  return x * cos[:, :, None] + rotated * sin[:, :, None]


class Attention(nnx.Module):
  """Causal grouped-query attention: query head h reads kv head h // (heads / kv_heads)."""

  def __init__(self, cfg: ModelConfig, rules: Rules, *, rngs: nnx.Rngs):
    d, h, kv, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    self.cfg = cfg
    self.rules = rules
    self.q_proj = normal(rngs, cfg, (d, h, hd), ("embed", "heads", "head_dim"))
    self.k_proj = normal(rngs, cfg, (d, kv, hd), ("embed", "kv_heads", "head_dim"))
    self.v_proj = normal(rngs, cfg, (d, kv, hd), ("embed", "kv_heads", "head_dim"))
    self.o_proj = normal(rngs, cfg, (h, hd, d), ("heads", "head_dim", "embed"))
    if cfg.qkv_bias:
      self.q_bias = param(jnp.zeros((h, hd), cfg.param_dtype), ("heads", "head_dim"))
      self.k_bias = param(jnp.zeros((kv, hd), cfg.param_dtype), ("kv_heads", "head_dim"))
      self.v_bias = param(jnp.zeros((kv, hd), cfg.param_dtype), ("kv_heads", "head_dim"))
    if cfg.qk_norm:
      self.q_norm = RMSNorm(hd, cfg.rms_norm_eps, ("head_dim",), cfg.param_dtype)
      self.k_norm = RMSNorm(hd, cfg.rms_norm_eps, ("head_dim",), cfg.param_dtype)

  def _project(self, x, kernel, bias_name, names):
    y = jnp.einsum("bld,dnh->blnh", x, kernel[...].astype(x.dtype))
    if self.cfg.qkv_bias:
      y = y + getattr(self, bias_name)[...].astype(x.dtype)
    return constrain(y, names, self.rules)

  def qkv(self, x, cos, sin):
    """Queries `[B, L, heads, head_dim]`, keys and values `[B, L, kv_heads, head_dim]` of
    x `[B, L, D]`, rotated by cos/sin `[B, L, head_dim]`: what a KV cache stores."""
    q = self._project(x, self.q_proj, "q_bias", ("batch", "length", "heads", "head_dim"))
    k = self._project(x, self.k_proj, "k_bias", ("batch", "length", "kv_heads", "head_dim"))
    v = self._project(x, self.v_proj, "v_bias", ("batch", "length", "kv_heads", "head_dim"))
    if self.cfg.qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

  def attend(self, q, k, v, mask):
    """q `[B, Lq, heads, hd]` over k/v `[B, Lk, kv_heads, hd]`; mask `[B, Lq, Lk]` → `[B, Lq, D]`.

    Lk may exceed Lq: a decode step's one query reads every slot of a KV cache. `mask` may
    also be a `TreeMask` (packed forests, Lq = Lk): each query block then reads its keys."""
    if isinstance(mask, TreeMask):
      return mask.attend(self.attend, q, k, v)
    cfg = self.cfg
    b, l = q.shape[:2]
    groups = cfg.num_heads // cfg.num_kv_heads
    q = q.reshape(b, l, cfg.num_kv_heads, groups, cfg.head_dim)
    scores = jnp.einsum("bqkgh,bskh->bkgqs", q, k, preferred_element_type=jnp.float32)
    scores = jnp.where(mask[:, None, None], scores / math.sqrt(cfg.head_dim), _MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    out = jnp.einsum("bkgqs,bskh->bqkgh", probs, v).reshape(b, l, cfg.num_heads, cfg.head_dim)
    out = constrain(out, ("batch", "length", "heads", "head_dim"), self.rules)
    return jnp.einsum("blnh,nhd->bld", out, self.o_proj[...].astype(q.dtype))

  def __call__(self, x, cos, sin, mask):
    """x `[B, L, D]`; cos/sin `[B, L, head_dim]`; mask `[B, L, L]` (query, key) or a
    `TreeMask` → `[B, L, D]`."""
    return self.attend(*self.qkv(x, cos, sin), mask)


class MLP(nnx.Module):
  """SwiGLU: down(silu(gate·x) ⊙ up·x) (Shazeer 2020)."""

  def __init__(self, cfg: ModelConfig, rules: Rules, *, rngs: nnx.Rngs):
    d, f = cfg.hidden_size, cfg.intermediate_size
    self.rules = rules
    self.gate_proj = normal(rngs, cfg, (d, f), ("embed", "mlp"))
    self.up_proj = normal(rngs, cfg, (d, f), ("embed", "mlp"))
    self.down_proj = normal(rngs, cfg, (f, d), ("mlp", "embed"))

  def __call__(self, x):
    gate = jnp.einsum("bld,df->blf", x, self.gate_proj[...].astype(x.dtype))
    up = jnp.einsum("bld,df->blf", x, self.up_proj[...].astype(x.dtype))
    hidden = constrain(jax.nn.silu(gate) * up, ("batch", "length", "mlp"), self.rules)
    return jnp.einsum("blf,fd->bld", hidden, self.down_proj[...].astype(x.dtype))


class DecoderLayer(nnx.Module):
  """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

  def __init__(self, cfg: ModelConfig, rules: Rules, *, rngs: nnx.Rngs):
    self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ("embed",), cfg.param_dtype)
    self.attn = Attention(cfg, rules, rngs=rngs)
    self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ("embed",),
                                  cfg.param_dtype)
    self.mlp = MLP(cfg, rules, rngs=rngs)
    self.rules = rules

  def qkv(self, x, cos, sin):
    """The attention's q, k, v of the block input x (see `Attention.qkv`)."""
    return self.attn.qkv(self.input_norm(x), cos, sin)

  def finish(self, x, q, k, v, mask):
    """The block output from its input x, its queries, and the keys/values to attend to
    (its own, or a KV cache holding them)."""
    x = x + self.attn.attend(q, k, v, mask)
    x = x + self.mlp(self.post_attn_norm(x))
    return constrain(x, ("batch", "length", "embed"), self.rules)

  def __call__(self, x, cos, sin, mask):
    return self.finish(x, *self.qkv(x, cos, sin), mask)
