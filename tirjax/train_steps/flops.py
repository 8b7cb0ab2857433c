"""Model FLOPs of a train step and model FLOPs utilisation (MFU).

Following PaLM (Chowdhery et al. 2022, Appendix B), a training token costs

    6·N + 12·n_layers·n_heads·head_dim·S

FLOPs: 6 per matmul parameter (2 forward, 4 backward) plus the attention score and value
products (QKᵀ and AV, forward and backward) over a context of S tokens, counted in full
(not halved for causality). N counts the parameters that enter a matmul per token: every
parameter except an untied input embedding, which is a lookup (the unembedding is a
matmul; a tied table is counted once, as the unembedding). Recomputation (remat) is not
counted: MFU measures useful work. MFU = model FLOPs / (step time · peak FLOP/s of all chips).
"""

from __future__ import annotations

from tirjax.models import decoder
from tirjax.models.config import ModelConfig


def matmul_params(cfg: ModelConfig) -> int:
  """N: parameters that enter a matmul for every token (see the module docstring)."""
  total = decoder.num_params(decoder.abstract(cfg))
  return total - (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size)


def attention_flops_per_token(cfg: ModelConfig, context: int) -> int:
  """`12·n_layers·n_heads·head_dim·S`: QKᵀ and AV, forward (2 each) and backward (4 each)."""
  return 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * context


def train_flops_per_token(cfg: ModelConfig, context: int) -> int:
  """`6·N + 12·n_layers·n_heads·head_dim·S` (PaLM, Appendix B)."""
  return 6 * matmul_params(cfg) + attention_flops_per_token(cfg, context)


def train_step_flops(cfg: ModelConfig, rows: int, length: int) -> int:
  """Model FLOPs of one update on `rows` sequences of `length` tokens."""
  return rows * length * train_flops_per_token(cfg, length)


def mfu(flops: float, seconds: float, peak_flops_per_s: float) -> float:
  """Model FLOPs utilisation: achieved model FLOP/s over the peak (of all chips together)."""
  if not (seconds > 0 and peak_flops_per_s > 0):
    raise ValueError(f"mfu: seconds and peak_flops_per_s must be > 0, got {seconds}, "
                     f"{peak_flops_per_s}")
  return flops / seconds / peak_flops_per_s
