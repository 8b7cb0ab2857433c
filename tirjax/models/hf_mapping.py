"""Per-family parameter tables: Hugging Face tensor name ↔ tirjax parameter path.

In the style of Tunix's `_get_key_and_transform_mapping`: one row per tensor, `{i}` standing
for the layer index (tirjax stacks layers on a leading axis), and a layout kind that says how
the tensor is rearranged. Both `load` and `export` in `hf_io` read these tables.

Layout kinds:
  same      identical shape (embeddings, norm scales)
  flat      tirjax `[heads, head_dim]` ↔ HF `[heads·head_dim]` (q/k/v biases)
  linear:n  tirjax kernel `[in…, out…]` with n input dims ↔ HF `nn.Linear.weight`
            `[prod(out), prod(in)]`, i.e. a transpose plus a reshape
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np

from tirjax.models.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class Rule:
  hf: str  # HF name; "{i}" marks a per-layer tensor
  path: tuple[str, ...]  # tirjax parameter path (nnx state keys)
  kind: str = "same"  # "same", "flat", "linear:1", "linear:2"

  @property
  def per_layer(self) -> bool:
    return "{i}" in self.hf


def _layer(hf: str, *path: str, kind: str = "same") -> Rule:
  return Rule(f"model.layers.{{i}}.{hf}", ("layers",) + path, kind)


_COMMON = (
    Rule("model.embed_tokens.weight", ("embed",)),
    Rule("model.norm.weight", ("final_norm", "scale")),
    _layer("input_layernorm.weight", "input_norm", "scale"),
    _layer("post_attention_layernorm.weight", "post_attn_norm", "scale"),
    _layer("self_attn.q_proj.weight", "attn", "q_proj", kind="linear:1"),
    _layer("self_attn.k_proj.weight", "attn", "k_proj", kind="linear:1"),
    _layer("self_attn.v_proj.weight", "attn", "v_proj", kind="linear:1"),
    _layer("self_attn.o_proj.weight", "attn", "o_proj", kind="linear:2"),
    _layer("mlp.gate_proj.weight", "mlp", "gate_proj", kind="linear:1"),
    _layer("mlp.up_proj.weight", "mlp", "up_proj", kind="linear:1"),
    _layer("mlp.down_proj.weight", "mlp", "down_proj", kind="linear:1"),
)
_LM_HEAD = Rule("lm_head.weight", ("lm_head",))

TABLES: dict[str, tuple[Rule, ...]] = {
    "qwen3": _COMMON + (
        _layer("self_attn.q_norm.weight", "attn", "q_norm", "scale"),
        _layer("self_attn.k_norm.weight", "attn", "k_norm", "scale"),
    ),
    "qwen2": _COMMON + (
        _layer("self_attn.q_proj.bias", "attn", "q_bias", kind="flat"),
        _layer("self_attn.k_proj.bias", "attn", "k_bias", kind="flat"),
        _layer("self_attn.v_proj.bias", "attn", "v_bias", kind="flat"),
    ),
    "llama": _COMMON,
}

# Tensors some checkpoints carry that the model derives or shares: skipped on load (as vLLM
# does). Tied models may still store lm_head.weight.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def rules(cfg: ModelConfig) -> tuple[Rule, ...]:
  """The family's table, with `lm_head` for untied embeddings."""
  table = TABLES[cfg.family]
  return table if cfg.tie_word_embeddings else table + (_LM_HEAD,)


def ignored(name: str, cfg: ModelConfig) -> bool:
  return name.endswith(IGNORED_SUFFIXES) or (cfg.tie_word_embeddings
                                             and name == _LM_HEAD.hf)


def hf_names(rule: Rule, num_layers: int) -> list[tuple[str, Optional[int]]]:
  """(HF name, layer index or None) of every tensor a rule covers."""
  if rule.per_layer:
    return [(rule.hf.format(i=i), i) for i in range(num_layers)]
  return [(rule.hf, None)]


def hf_shape(kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
  """HF shape of one tensor whose tirjax shape (layer axis removed) is `shape`."""
  if kind == "same":
    return tuple(shape)
  if kind == "flat":
    return (math.prod(shape),)
  n = int(kind.split(":")[1])
  return (math.prod(shape[n:]), math.prod(shape[:n]))


def to_tirjax(kind: str, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
  """HF tensor → tirjax layout `shape`."""
  if kind.startswith("linear"):
    x = x.T
  return x.reshape(shape)


def to_hf(kind: str, x: np.ndarray) -> np.ndarray:
  """tirjax array → HF layout (a contiguous array, as safetensors needs)."""
  shape = hf_shape(kind, x.shape)
  if kind.startswith("linear"):
    x = x.reshape(shape[::-1]).T
  return np.ascontiguousarray(x.reshape(shape))
