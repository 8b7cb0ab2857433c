"""Solving a batch chunk by chunk.

The matching kernels run lockstep loops over a batch of small problems. On CPU a whole
paper-scale batch (4096 problems) at once is markedly slower per problem than chunks of a
few hundred solved one after the other: a chunk's working set stays in cache, and a loop that
runs until its slowest problem is done is held back only by the slowest of its chunk.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp

CHUNK = 256  # problems solved together


def map_chunks(fn: Callable, xs: Sequence[Optional[jax.Array]], chunk: int = CHUNK):
  """fn over chunks of the leading (batch) axis of `xs`, results concatenated.

  `xs` are arrays with a common leading axis N, or None (passed through as None). The batch
  is padded with zeros (False) to a multiple of the chunk; `fn` must keep padding problems
  harmless. Every leaf of fn's result has the chunk as its leading axis.
  """
  N = next(x for x in xs if x is not None).shape[0]
  size = max(min(N, chunk), 1)
  count = -(-N // size)

  def split(x):
    if x is None:
      return None
    x = jnp.pad(x, [(0, count * size - N)] + [(0, 0)] * (x.ndim - 1))
    return x.reshape((count, size) + x.shape[1:])

  out = jax.lax.map(lambda parts: fn(*parts), tuple(split(x) for x in xs))
  return jax.tree_util.tree_map(lambda y: y.reshape((count * size,) + y.shape[2:])[:N], out)
