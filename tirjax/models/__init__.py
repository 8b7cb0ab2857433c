"""Policy models: a Flax NNX decoder for the Qwen3, Qwen2/2.5 and Llama 3 families.

  config      ModelConfig, presets (`preset("qwen3_0p6b")`, `tiny(vocab_size=...)`)
  decoder     Decoder (forward, hidden states), init / abstract
  kv_cache    KVCache, prefill / decode_step: cached decoding (the JAX sampler's model side)
  (logical axis names → mesh partition specs: `tirjax.sharding`)
  hf_io       load_hf / export_hf (safetensors, streamed; per-family tables in hf_mapping)
  logprobs    token_logprobs: chunked log-probs and entropy with a chunked backward pass
"""

from tirjax.models.config import ModelConfig, RopeScaling, preset, tiny
from tirjax.models.decoder import Decoder, abstract, init
from tirjax.models.hf_io import CheckpointMismatch, export_hf, load_hf
from tirjax.models.kv_cache import KVCache, decode_step, prefill

__all__ = ["CheckpointMismatch", "Decoder", "KVCache", "ModelConfig", "RopeScaling", "abstract",
           "decode_step", "export_hf", "init", "load_hf", "prefill", "preset", "tiny"]
