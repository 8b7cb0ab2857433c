"""tirjax's own teacher for hand-over checks: teacher-forced log-probs of a `Decoder`.

A `DecoderTeacher` is a `handover.TeacherLogprobs`: given token-id sequences it returns, per
sequence, `log p(seq[t] | seq[:t])` from `token_logprobs` (entry 0 is 0). Sequences are
right-padded to a few shapes (rows to a multiple of 8, width to a power of two, at least 64),
so a probe batch compiles once; new parameters (`set_params`), and other teachers of the same
architecture, reuse the executable.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import numpy as np
from flax import nnx

from tirjax.models.logprobs import token_logprobs

_MIN_WIDTH = 64


@functools.lru_cache(maxsize=16)
def _logprobs_fn(graphdef, chunk_size: int):
  return jax.jit(lambda p, t, v: token_logprobs(nnx.merge(graphdef, p), t, v,
                                                chunk_size=chunk_size)[0])


def padded_shape(lengths: Sequence[int]) -> tuple[int, int]:
  """(rows, width) that hold sequences of these lengths."""
  if not lengths or min(lengths) < 1:
    raise ValueError(f"lengths: need at least one sequence, none empty; got {list(lengths)}")
  rows = -(-len(lengths) // 8) * 8
  width = max(_MIN_WIDTH, 1 << (max(lengths) - 1).bit_length())
  return rows, width


class DecoderTeacher:
  """Teacher-forced log-probs of the decoder `nnx.merge(graphdef, params)`.

  Args:
    graphdef: the decoder's graph definition (`nnx.split(model)[0]`).
    params: its parameters (`nnx.State`); replaced with `set_params`.
    chunk_size: positions whose `[chunk, vocab]` logits exist at a time.
  """

  def __init__(self, graphdef, params, chunk_size: int = 256):
    if chunk_size < 1:
      raise ValueError(f"chunk_size: must be >= 1, got {chunk_size}")
    self._params = params
    self._fn = _logprobs_fn(graphdef, chunk_size)

  @classmethod
  def of(cls, model, chunk_size: int = 256) -> "DecoderTeacher":
    graphdef, params = nnx.split(model)
    return cls(graphdef, params, chunk_size)

  def set_params(self, params) -> None:
    self._params = params

  def __call__(self, seqs: Sequence[Sequence[int]]) -> list[list[float]]:
    rows, width = padded_shape([len(s) for s in seqs])
    tokens = np.zeros((rows, width), np.int32)
    valid = np.zeros((rows, width), bool)
    for i, s in enumerate(seqs):
      tokens[i, :len(s)], valid[i, :len(s)] = s, True
    logp = np.asarray(self._fn(self._params, tokens, valid))
    return [logp[i, :len(s)].tolist() for i, s in enumerate(seqs)]
