"""Shared by the toolworld vLLM tests: the served model, hand-overs, perturbed weights.

The server itself is the session fixture `toolworld` of `vllm_toolworld_fixtures.py`.
"""

import dataclasses
import os

import jax
from flax import nnx

from tirjax.models import config, decoder
from tirjax.models.hf_io import export_hf
from tirjax.sampling.teacher import DecoderTeacher
from tirjax.sampling.vllm import TINY_HEAD_DIM, VLLMSampler

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
