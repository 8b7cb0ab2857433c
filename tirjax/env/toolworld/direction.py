"""How often a policy takes the direction a toolworld question states, read off its log-probs.

For each task whose plan takes a direction (compare's max/min, sort's order, filter's
over/under, convert's from/to), the correct demonstration's steps before the first
direction-bearing step are the context, and that step is scored twice, as demonstrated and
flipped (`demos.direction_steps`). The policy's preference for the right one,

    P(right) = p(step) / (p(step) + p(flipped step)),

averaged over tasks, is the lever that confused demonstrations (`sft.demos.p_confuse` = 1)
leave at 0.5 and that only RL can raise: teacher-forced, so it carries no sampling noise, and it
costs one forward pass per task.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from tirjax.env import chat
from tirjax.env.tools import Task
from tirjax.env.toolworld.demos import direction_steps
from tirjax.models.logprobs import token_logprobs


def _scored(tokenizer, context, tools, step) -> tuple[list[int], list[bool]]:
  """Token ids of the conversation ending with `step`, and a mask of `step`'s own tokens."""
  ids, mask = chat.encode_conversation(tokenizer, context + [{"role": "assistant",
                                                              "content": step}], tools)
  start = len(chat.encode_conversation(tokenizer, context, tools)[0])
  return ids, [k >= start and bool(m) for k, m in enumerate(mask)]


def step_logprobs(model, batch: Sequence[tuple[list[int], list[bool]]], rows: int,
                  chunk_size: int = 1024) -> np.ndarray:
  """Σ log p over each sequence's masked tokens, in batches of `rows` sequences (lengths
  rounded up to a multiple of 64: a few shapes, a few compilations)."""
  logp = jax.jit(lambda m, t, v: token_logprobs(m, t, v, chunk_size=chunk_size)[0])
  out = []
  for start in range(0, len(batch), rows):
    part = batch[start:start + rows]
    length = -(-max(len(ids) for ids, _ in part) // 64) * 64
    tokens, valid, own = (np.zeros((rows, length), t) for t in (np.int32, bool, bool))
    for b, (ids, mask) in enumerate(part):
      tokens[b, :len(ids)], valid[b, :len(ids)], own[b, :len(ids)] = ids, True, mask
    lp = np.asarray(logp(model, jnp.asarray(tokens), jnp.asarray(valid)))
    out += list(np.where(own, lp, 0.0).sum(axis=1)[:len(part)])
  return np.asarray(out, np.float64)


def direction_preference(model, tokenizer, tasks: Sequence[Task], answer_protocol: str,
                         rows: int = 32) -> dict[str, float]:
  """`eval/direction_p_right` (the mean of P(right), see the module docstring) and
  `eval/direction_tasks` (how many of `tasks` have a direction-bearing step); {} if none."""
  pairs = [p for p in (direction_steps(t, answer_protocol) for t in tasks) if p is not None]
  if not pairs:
    return {}
  seqs = [_scored(tokenizer, c, tools, step) for c, tools, right, wrong in pairs
          for step in (right, wrong)]
  lp = step_logprobs(model, seqs, rows)
  p_right = 1.0 / (1.0 + np.exp(np.clip(lp[1::2] - lp[0::2], -60.0, 60.0)))
  return {"eval/direction_p_right": float(p_right.mean()), "eval/direction_tasks": len(pairs)}
