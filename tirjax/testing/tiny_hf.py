"""A tiny random Qwen3 saved by transformers, for sampler tests and benchmarks.

vLLM serves any HF directory (config, safetensors, tokenizer); this one starts in seconds
and keeps every server small. The tokenizer is a word-level one built with `tokenizers`: the
samplers work on token ids only, so its vocabulary is just `w<i>` per id.
"""

from __future__ import annotations

import dataclasses
import os

from tirjax import option_checks

EOS_ID = 1


@dataclasses.dataclass(frozen=True)
class TinyQwen3:
  vocab_size: int = 256
  hidden_size: int = 64
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 32  # the smallest head size vLLM's CPU attention supports
  intermediate_size: int = 128
  max_position_embeddings: int = 512
  initializer_range: float = 0.3  # HF's 0.02 gives near-uniform next-token distributions

  def __post_init__(self):
    for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                 "head_dim", "intermediate_size", "max_position_embeddings"):
      option_checks.at_least(name, getattr(self, name), 1)
    option_checks.above("initializer_range", self.initializer_range, 0)
    option_checks.at_least("vocab_size", self.vocab_size, 8)
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_kv_heads: must divide num_heads={self.num_heads}, "
                       f"got {self.num_kv_heads}")


def _config(spec: TinyQwen3):
  import transformers  # noqa: PLC0415  (heavy; only callers that save models pay for it)
  return transformers.Qwen3Config(
      vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
      num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
      num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim,
      intermediate_size=spec.intermediate_size,
      max_position_embeddings=spec.max_position_embeddings, tie_word_embeddings=True,
      initializer_range=spec.initializer_range,
      bos_token_id=EOS_ID, eos_token_id=EOS_ID, pad_token_id=0, dtype="float32")


def save_tokenizer(vocab_size: int, path: str) -> None:
  """Saves a word-level tokenizer over `<pad>`, `<eos>`, `w2` … `w{vocab_size-1}`."""
  import tokenizers  # noqa: PLC0415
  import transformers  # noqa: PLC0415
  vocab = {"<pad>": 0, "<eos>": EOS_ID, **{f"w{i}": i for i in range(2, vocab_size)}}
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<pad>"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  tok.decoder = tokenizers.decoders.WordPiece(prefix="##", cleanup=False)
  fast = transformers.PreTrainedTokenizerFast(
      tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<eos>",
      unk_token="<pad>")
  fast.save_pretrained(path)


def save_model(path: str, spec: TinyQwen3 = TinyQwen3(), seed: int = 0):
  """Saves a randomly initialised float32 Qwen3 and its tokenizer; returns the torch model."""
  import torch  # noqa: PLC0415
  import transformers  # noqa: PLC0415
  torch.manual_seed(seed)
  model = transformers.Qwen3ForCausalLM(_config(spec)).to(torch.float32).eval()
  os.makedirs(path, exist_ok=True)
  model.save_pretrained(path, safe_serialization=True)
  save_tokenizer(spec.vocab_size, path)
  return model


def torch_logits(model, seq):
  """[len(seq), vocab] float64 next-token logits of a transformers model."""
  import torch  # noqa: PLC0415
  with torch.no_grad():
    return model(torch.tensor([list(seq)])).logits[0].double().numpy()


def torch_teacher(model):
  """A `teacher_logprobs` callable (see `handover.py`) from a transformers causal LM."""
  import numpy as np  # noqa: PLC0415
  import scipy.special  # noqa: PLC0415

  def teacher_logprobs(seqs):
    out = []
    for seq in seqs:
      logp = scipy.special.log_softmax(torch_logits(model, seq), axis=-1)
      out.append(np.concatenate([[0.0], logp[np.arange(len(seq) - 1), seq[1:]]]))
    return out
  return teacher_logprobs
