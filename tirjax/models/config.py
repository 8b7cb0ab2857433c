"""Decoder configuration and the named presets.

One decoder serves three Hugging Face families; the family decides the attention details:

  qwen3  q/k RMSNorm over head_dim, no projection biases (Qwen3ForCausalLM)
  qwen2  q/k/v projection biases (Qwen2ForCausalLM; Qwen2 and Qwen2.5)
  llama  neither; usually "llama3" RoPE scaling (LlamaForCausalLM; Llama 3.x)

Presets copy the published `config.json` of each checkpoint on the Hugging Face Hub:

  qwen3_0p6b  https://huggingface.co/Qwen/Qwen3-0.6B/blob/main/config.json
  qwen3_1p7b  https://huggingface.co/Qwen/Qwen3-1.7B/blob/main/config.json
  qwen3_4b    https://huggingface.co/Qwen/Qwen3-4B/blob/main/config.json
  qwen3_8b    https://huggingface.co/Qwen/Qwen3-8B/blob/main/config.json
  qwen2p5_7b  https://huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json
  llama3_8b   https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json
              (Llama 3.1: the 8B config with rope_type "llama3"; Meta-Llama-3-8B has none)

Parameters and activations carry logical axis names (`vocab`, `embed`, `mlp`, `heads`,
`kv_heads`, `head_dim`, `layers`; activations also `batch`, `length`), mapped onto mesh axes
by the rules of `tirjax.sharding` (`DEFAULT_RULES`, or the config's `ShardingOptions.rules`),
which the `Decoder` is given at construction.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from tirjax import option_checks

FAMILIES = ("qwen3", "qwen2", "llama")
DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """Llama 3.1 RoPE frequency scaling (HF `rope_type: "llama3"`)."""

  factor: float
  low_freq_factor: float
  high_freq_factor: float
  original_max_position_embeddings: int

  def __post_init__(self):
    option_checks.above("rope_scaling.factor", self.factor, 0)
    if not 0 < self.low_freq_factor < self.high_freq_factor:
      raise ValueError("rope_scaling: need 0 < low_freq_factor < high_freq_factor, got "
                       f"{self.low_freq_factor}, {self.high_freq_factor}")
    option_checks.at_least("rope_scaling.original_max_position_embeddings",
                           self.original_max_position_embeddings, 1)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """A decoder-only transformer: GQA attention, RoPE, RMSNorm, SwiGLU."""

  family: str
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float
  rms_norm_eps: float
  tie_word_embeddings: bool
  max_position_embeddings: int
  rope_scaling: Optional[RopeScaling] = None
  param_dtype: str = "float32"
  dtype: str = "float32"  # activations; logits and softmax statistics are always float32
  remat: bool = False  # recompute each layer in the backward pass (jax.checkpoint)
  init_std: float = 0.02  # normal init of projections and embeddings (HF initializer_range)

  def __post_init__(self):
    option_checks.one_of("family", self.family, FAMILIES)
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                 "num_kv_heads", "head_dim", "max_position_embeddings"):
      option_checks.at_least(name, getattr(self, name), 1)
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads: {self.num_heads} is not a multiple of num_kv_heads "
                       f"{self.num_kv_heads}")
    if self.head_dim % 2:
      raise ValueError(f"head_dim: RoPE needs an even head_dim, got {self.head_dim}")
    for name in ("rope_theta", "rms_norm_eps", "init_std"):
      option_checks.above(name, getattr(self, name), 0)
    for name in ("param_dtype", "dtype"):
      option_checks.one_of(name, getattr(self, name), DTYPES)

  @property
  def qk_norm(self) -> bool:
    return self.family == "qwen3"

  @property
  def qkv_bias(self) -> bool:
    return self.family == "qwen2"

  def replace(self, **changes) -> "ModelConfig":
    return dataclasses.replace(self, **changes)


def tiny(vocab_size: int = 512, family: str = "qwen3", **changes) -> ModelConfig:
  """A two-layer model for tests and CPU runs; `vocab_size` matches a small BPE tokenizer."""
  cfg = ModelConfig(family=family, vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                    num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=1e6,
                    rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=4096)
  return cfg.replace(**changes)


def _qwen3(hidden, intermediate, layers, heads, tie) -> ModelConfig:
  return ModelConfig(family="qwen3", vocab_size=151936, hidden_size=hidden,
                     intermediate_size=intermediate, num_layers=layers, num_heads=heads,
                     num_kv_heads=8, head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6,
                     tie_word_embeddings=tie, max_position_embeddings=40960,
                     param_dtype="bfloat16", dtype="bfloat16")


PRESETS = {
    "tiny": tiny,
    "qwen3_0p6b": lambda: _qwen3(1024, 3072, 28, 16, tie=True),
    "qwen3_1p7b": lambda: _qwen3(2048, 6144, 28, 16, tie=True),
    "qwen3_4b": lambda: _qwen3(2560, 9728, 36, 32, tie=True),
    "qwen3_8b": lambda: _qwen3(4096, 12288, 36, 32, tie=False),
    "qwen2p5_7b": lambda: ModelConfig(
        family="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
        num_layers=28, num_heads=28, num_kv_heads=4, head_dim=128, rope_theta=1e6,
        rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=131072,
        param_dtype="bfloat16", dtype="bfloat16"),
    "llama3_8b": lambda: ModelConfig(
        family="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
        num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=500000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=131072,
        rope_scaling=RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                 original_max_position_embeddings=8192),
        param_dtype="bfloat16", dtype="bfloat16"),
}


def preset(name: str, **changes) -> ModelConfig:
  """The named preset with fields replaced, e.g. `preset("tiny", vocab_size=1000)`."""
  if name not in PRESETS:
    raise ValueError(f"preset: unknown name {name!r}; known: {sorted(PRESETS)}")
  if name == "tiny":
    return tiny(**changes)
  return PRESETS[name]().replace(**changes)
