"""The packed path's shapes as part of a run's resumable state.

A packer's shapes only grow within a run (`tirjax.train_steps.packed.Packer`): a step's batch
is padded up to the largest sizes any earlier step used, so the layout of step t depends on
the steps before it. XLA's CPU kernels do not add a reduction in the same order at two padded
lengths (a length decides its vector blocking), so the same rows laid out at two sizes give
float32 results one or two ulps apart, and a run resumed with fresh packers drifts from the
uninterrupted run (issue 52: 12.6% of one weight matrix, by ≤ 7.5e-9, after an SFT resume).

The layout is therefore checkpointed state, not recomputed: each packer's largest sizes are
saved in the checkpoint's data position (`KEY`, one entry per packer by name) and restored
before the resumed run packs anything. A layout that is a pure function of the step's data
and the config would have cost either a compilation whenever a step's sizes differ (the
update compiled on 17 of `make run`'s 40 RL steps before the ratchet) or the config's largest
shape on every step (every step pays the worst padding); the saved sizes keep both the
ratchet's few compilations and bit-exact resume.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from tirjax.checkpoint import TrainState

KEY = "packed_shapes"


def _packers(owners: Mapping[str, Any]) -> dict:
  """`owners` (steps and log-prob passes, by name) that pack: their `Packer`s."""
  return {name: owner.packer for name, owner in owners.items()
          if owner is not None and getattr(owner, "packer", None) is not None}


def resume(state: TrainState, owners: Mapping[str, Any]) -> None:
  """Each packer of `owners` continues from the sizes `state`'s checkpoint saved under its
  name (a fresh start where none were saved). Call before the first step packs."""
  saved = state.data_position.get(KEY, {})
  for name, packer in _packers(owners).items():
    packer.resume(saved.get(name))


def recorded(state: TrainState, owners: Mapping[str, Any]) -> TrainState:
  """`state` whose data position holds the packers' current sizes (before a checkpoint)."""
  saved = dict(state.data_position.get(KEY, {}))
  for name, packer in _packers(owners).items():
    sizes = packer.saved()
    if sizes is not None:
      saved[name] = sizes
  return dataclasses.replace(state, data_position={**state.data_position, KEY: saved})


def cleared(data_position: Mapping[str, Any]) -> dict:
  """`data_position` without saved sizes (a new phase's packers start fresh)."""
  return {k: v for k, v in data_position.items() if k != KEY}
