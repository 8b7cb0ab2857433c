"""Padded call arrays of episodes, for `Rollouts.calls`, `call_valid`, `gt_valid`, `call_solves`.

`encode_row` turns one episode's kept calls (per step, terminal calls already excluded, as in
`StepResult.calls`) and its task's flat ground-truth calls into fixed-size arrays with a
shared `CallEncoder` (spec §2); `stack_rows` stacks rows into a `CallEncoding` and the masks.
`call_sim` then comes from `tirjax.matching.similarity.call_similarity(enc, call_valid,
gt_valid)`. With `ParseLimits.max_calls <= K` and `max_arguments <= P`, no episode overflows.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import jax.numpy as jnp
import numpy as np

from tirjax.matching.encoding import PAD, CallEncoder
from tirjax.rollouts import CallEncoding


@dataclasses.dataclass
class RowCalls:
  pred_name: np.ndarray  # [T, K] int32
  pred_keys: np.ndarray  # [T, K, P] int32
  pred_values: np.ndarray  # [T, K, P] int32
  call_valid: np.ndarray  # [T, K] bool
  call_solves: np.ndarray  # [T, K] bool
  gt_name: np.ndarray  # [C] int32
  gt_keys: np.ndarray  # [C, P] int32
  gt_values: np.ndarray  # [C, P] int32
  gt_valid: np.ndarray  # [C] bool


def encode_row(encoder: CallEncoder, step_calls: Sequence[Sequence[dict]],
               gt_calls: Sequence[dict], *, max_steps: int, max_calls: int, max_gt_calls: int,
               max_params: int,
               step_solves: Optional[Sequence[Sequence[bool]]] = None) -> RowCalls:
  """Encodes one episode; raises ValueError naming the size that is too small."""
  T, K, C, P = max_steps, max_calls, max_gt_calls, max_params
  if len(step_calls) > T:
    raise ValueError(f"max_steps={T} is too small: the episode has {len(step_calls)} steps")
  if len(gt_calls) > C:
    raise ValueError(f"max_gt_calls={C} is too small: the task has {len(gt_calls)} "
                     "ground-truth calls")
  if step_solves is not None and [len(s) for s in step_solves] != [len(s) for s in step_calls]:
    raise ValueError("step_solves: must give one flag per call of each step")
  row = RowCalls(
      pred_name=np.full((T, K), PAD, np.int32), pred_keys=np.full((T, K, P), PAD, np.int32),
      pred_values=np.full((T, K, P), PAD, np.int32), call_valid=np.zeros((T, K), bool),
      call_solves=np.zeros((T, K), bool), gt_name=np.full(C, PAD, np.int32),
      gt_keys=np.full((C, P), PAD, np.int32), gt_values=np.full((C, P), PAD, np.int32),
      gt_valid=np.zeros(C, bool))
  for t, calls in enumerate(step_calls):
    if len(calls) > K:
      raise ValueError(f"max_calls={K} is too small: step {t} has {len(calls)} calls")
    for k, call in enumerate(calls):
      row.pred_name[t, k], row.pred_keys[t, k], row.pred_values[t, k] = encoder.encode(call, P)
      row.call_valid[t, k] = True
      if step_solves is not None:
        row.call_solves[t, k] = bool(step_solves[t][k])
  for c, call in enumerate(gt_calls):
    row.gt_name[c], row.gt_keys[c], row.gt_values[c] = encoder.encode(call, P)
    row.gt_valid[c] = True
  return row


def stack_rows(rows: Sequence[RowCalls]):
  """(CallEncoding, call_valid [B,T,K], gt_valid [B,C], call_solves [B,T,K]) as jax arrays."""
  if not rows:
    raise ValueError("rows: need at least one row")
  stack = {f.name: jnp.asarray(np.stack([getattr(r, f.name) for r in rows]))
           for f in dataclasses.fields(RowCalls)}
  enc = CallEncoding(**{k: stack[k] for k in ("pred_name", "pred_keys", "pred_values",
                                              "gt_name", "gt_keys", "gt_values")})
  return enc, stack["call_valid"], stack["gt_valid"], stack["call_solves"]
