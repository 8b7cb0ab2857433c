"""Hugging Face `config.json` ↔ `ModelConfig`.

Reads both the transformers 4 layout (`rope_theta`, `rope_scaling`, `torch_dtype`) and the
transformers 5 layout (`rope_parameters`, `dtype`); writes the transformers 4 layout, which
transformers 5 and vLLM also read.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Optional

from tirjax.models.config import ModelConfig, RopeScaling

ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "llama": "LlamaForCausalLM"}
_TORCH_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float32"}
# Keys `config_to_hf` writes itself; a base config's versions of them are dropped.
_OWNED = ("architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size",
          "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
          "hidden_act", "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling",
          "rope_parameters", "tie_word_embeddings", "torch_dtype", "dtype", "initializer_range",
          "attention_bias", "mlp_bias", "use_sliding_window", "layer_types")


class UnsupportedConfig(ValueError):
  """A config.json this decoder does not implement."""


def read(path: str) -> dict:
  """The parsed `config.json` of a checkpoint directory (or the file itself)."""
  file = os.path.join(path, "config.json") if os.path.isdir(path) else path
  if not os.path.exists(file):
    raise FileNotFoundError(f"{file}: no config.json in the checkpoint directory")
  with open(file) as f:
    return json.load(f)


def _rope(hf: Mapping[str, Any], where: str) -> tuple[float, Optional[RopeScaling]]:
  params = hf.get("rope_parameters")
  if params is None:
    params = dict(hf.get("rope_scaling") or {})
    params.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
  rope_type = params.get("rope_type", params.get("type", "default"))
  if params.get("partial_rotary_factor", 1.0) != 1.0:
    raise UnsupportedConfig(f"{where}: partial_rotary_factor "
                            f"{params['partial_rotary_factor']} is not supported")
  if rope_type == "default":
    return float(params["rope_theta"]), None
  if rope_type == "llama3":
    return float(params["rope_theta"]), RopeScaling(
        factor=float(params["factor"]), low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_position_embeddings=int(params["original_max_position_embeddings"]))
  raise UnsupportedConfig(f"{where}: rope_type {rope_type!r} is not supported "
                          "(supported: 'default', 'llama3')")


def config_from_hf(hf: Mapping[str, Any], *, where: str = "config.json",
                   **changes) -> ModelConfig:
  """The `ModelConfig` of a Hugging Face config dict; `changes` override fields (e.g. dtype).

  Raises:
    UnsupportedConfig: naming `where` and the key, for a model_type other than qwen3 / qwen2 /
      llama or a feature this decoder does not implement (biases on o/mlp projections,
      sliding-window attention, other activations or RoPE types).
  """
  family = hf.get("model_type")
  if family not in ARCHITECTURES:
    raise UnsupportedConfig(f"{where}: unsupported model_type {family!r} "
                            f"(supported: {sorted(ARCHITECTURES)})")
  if hf.get("hidden_act", "silu") != "silu":
    raise UnsupportedConfig(f"{where}: hidden_act {hf['hidden_act']!r} is not supported "
                            "(SwiGLU with silu only)")
  if family != "qwen2" and hf.get("attention_bias", False):
    raise UnsupportedConfig(f"{where}: attention_bias=true is not supported for {family}")
  if hf.get("mlp_bias", False):
    raise UnsupportedConfig(f"{where}: mlp_bias=true is not supported")
  layer_types = hf.get("layer_types") or ()
  if hf.get("use_sliding_window", False) or any(t != "full_attention" for t in layer_types):
    raise UnsupportedConfig(f"{where}: sliding-window attention is not supported")
  rope_theta, rope_scaling = _rope(hf, where)
  heads = hf["num_attention_heads"]
  torch_dtype = hf.get("torch_dtype") or hf.get("dtype") or "float32"
  param_dtype = _TORCH_DTYPES.get(str(torch_dtype).replace("torch.", ""), "float32")
  fields = dict(
      family=family, vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
      intermediate_size=hf["intermediate_size"], num_layers=hf["num_hidden_layers"],
      num_heads=heads, num_kv_heads=hf.get("num_key_value_heads") or heads,
      head_dim=hf.get("head_dim") or hf["hidden_size"] // heads, rope_theta=rope_theta,
      rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
      tie_word_embeddings=hf.get("tie_word_embeddings", False),
      max_position_embeddings=hf.get("max_position_embeddings", 4096),
      rope_scaling=rope_scaling, param_dtype=param_dtype, dtype=param_dtype,
      init_std=hf.get("initializer_range", 0.02))
  fields.update(changes)
  return ModelConfig(**fields)


def config_to_hf(cfg: ModelConfig, *, torch_dtype: str,
                 base: Optional[Mapping[str, Any]] = None) -> dict:
  """A config.json dict for `cfg`; other keys of `base` (token ids, ...) are kept."""
  out = {k: v for k, v in (base or {}).items() if k not in _OWNED}
  out.update(
      architectures=[ARCHITECTURES[cfg.family]], model_type=cfg.family,
      vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
      intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
      num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
      head_dim=cfg.head_dim, hidden_act="silu",
      max_position_embeddings=cfg.max_position_embeddings, rms_norm_eps=cfg.rms_norm_eps,
      rope_theta=cfg.rope_theta, tie_word_embeddings=cfg.tie_word_embeddings,
      torch_dtype=torch_dtype, initializer_range=cfg.init_std)
  r = cfg.rope_scaling
  out["rope_scaling"] = None if r is None else dict(
      rope_type="llama3", factor=r.factor, low_freq_factor=r.low_freq_factor,
      high_freq_factor=r.high_freq_factor,
      original_max_position_embeddings=r.original_max_position_embeddings)
  if cfg.family != "qwen2":
    out["attention_bias"] = False
  if cfg.family == "llama":
    out["mlp_bias"] = False
  else:
    out["use_sliding_window"] = False
  return dict(sorted(out.items()))
