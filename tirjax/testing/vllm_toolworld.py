"""One vLLM server of a tirjax model over the toolworld vocabulary, for the toolworld vLLM
tests: the served model, hand-overs, perturbed weights.

`serve_toolworld` builds the toolworld tokenizer and the `tiny` tirjax model over its
vocabulary (`tiny_model`), exports it with `export_hf` in float32 with the tokenizer files, and
serves it with one vLLM server (the tests' session fixture `toolworld`, in tests/conftest.py).
Tests hand over the weights they need first (`Toolworld.use`), so they do not depend on each
other's order.
"""

import contextlib
import dataclasses
import os
from typing import Iterator

import jax
import transformers
from flax import nnx

from tirjax.env.toolworld import build_tokenizer
from tirjax.models import config, decoder
from tirjax.models.hf_io import export_hf
from tirjax.sampling.teacher import DecoderTeacher
from tirjax.sampling.vllm import TINY_HEAD_DIM, VLLMOptions, VLLMSampler
from tirjax.sampling.vllm_server import ServerOptions
from tirjax.testing.vllm_processes import KV_CACHE_BYTES

TOL = 1e-3  # float32 on both sides
MAX_MODEL_LEN = 512  # = the rollouts' shapes.max_tokens


@dataclasses.dataclass
class Toolworld:
  tokenizer: object
  tokenizer_dir: str
  model: decoder.Decoder  # the weights the server starts from
  root: str  # where `export` writes
  sampler: VLLMSampler

  def export(self, model: decoder.Decoder, name: str) -> str:
    return export_hf(model, os.path.join(self.root, name), source_dir=self.tokenizer_dir,
                     dtype="float32", overwrite=True)

  def use(self, model: decoder.Decoder, name: str):
    """Exports `model`, hands it to the server and checks it; returns the report."""
    report = self.sampler.load_weights(self.export(model, name),
                                       teacher_logprobs=DecoderTeacher.of(model))
    assert report.gap.max_abs < TOL, report.gap
    return report


def tiny_model(vocab_size: int, seed: int = 0) -> decoder.Decoder:
  """The `tiny` preset with vLLM's head size and init_std 0.3 (the preset's 0.02 gives
  near-uniform next-token distributions, under which agreeing log-probs say little)."""
  return decoder.init(config.tiny(vocab_size=vocab_size, head_dim=TINY_HEAD_DIM, init_std=0.3),
                      seed=seed)


def perturbed(model: decoder.Decoder, scale: float, seed: int) -> decoder.Decoder:
  """A copy of `model` with N(0, scale²) noise added to every parameter."""
  graphdef, params = nnx.split(model)
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  noisy = [x + scale * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
  return nnx.merge(graphdef, jax.tree.unflatten(tree, noisy))


@contextlib.contextmanager
def serve_toolworld(root: str) -> Iterator[Toolworld]:
  """A `Toolworld` whose files live under `root`; its server is closed on exit."""
  tokenizer_dir = str(build_tokenizer(os.path.join(root, "tokenizer")))
  tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
  model = tiny_model(len(tokenizer))
  model_dir = export_hf(model, os.path.join(root, "start"), source_dir=tokenizer_dir,
                        dtype="float32")
  sampler = VLLMSampler(VLLMOptions(server=ServerOptions(
      model=model_dir, max_model_len=MAX_MODEL_LEN, kv_cache_memory_bytes=KV_CACHE_BYTES,
      log_path=os.path.join(root, "vllm-server.log"))))
  try:
    yield Toolworld(tokenizer=tokenizer, tokenizer_dir=tokenizer_dir, model=model,
                    root=str(root), sampler=sampler)
  finally:
    sampler.close()
