"""Train-state checkpoints (Orbax): params, optimizer state, step, PRNG key, data position,
policy version.

* A checkpoint is complete or absent: Orbax writes each step into a temporary directory and
  renames it into place after everything is written, so a crash during a save leaves the
  previous step as the latest usable one (the partial directory is ignored and cleaned up).
* The last `max_to_keep` steps are kept.
* `restore` places every array on the sharding of the matching target leaf, so a state saved
  on one device mesh restores onto another.
* A directory belongs to one run: it holds a `tirjax_run.json` naming the run id. Opening a
  directory of another run, or a non-empty directory without that file, is an error unless
  `overwrite=True`, which empties it first.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Any, Mapping, Optional

import jax
import orbax.checkpoint as ocp

RUN_FILE = "tirjax_run.json"


class CheckpointError(RuntimeError):
  """A checkpoint could not be written (or read back), named by its directory and step."""


class RunMismatch(RuntimeError):
  """The checkpoint directory belongs to another run (or is not a tirjax directory)."""


@dataclasses.dataclass(frozen=True)
class CheckpointOptions:
  max_to_keep: int = 3
  async_save: bool = True  # write in a background thread; `wait`/`close` join it

  def __post_init__(self):
    if self.max_to_keep < 1:
      raise ValueError(f"max_to_keep: must be >= 1, got {self.max_to_keep}")


@dataclasses.dataclass(frozen=True)
class TrainState:
  """What a training run needs to resume exactly.

  `params` and `opt_state` are pytrees of arrays (e.g. `nnx.state(model, nnx.Param)` and an
  optax state); `rng` is a typed key (`jax.random.key`) or raw uint32 key data;
  `data_position` is JSON (where the data iterator resumes).
  """

  step: int
  params: Any
  opt_state: Any
  rng: jax.Array
  data_position: Mapping[str, Any]
  policy_version: int


def _is_typed_key(x) -> bool:
  return jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _read_run_id(directory: str) -> Optional[str]:
  path = os.path.join(directory, RUN_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)["run_id"]


def _claim(directory: str, run_id: str, overwrite: bool) -> None:
  """Check that `directory` is this run's (or empty); with `overwrite`, empty it first."""
  os.makedirs(directory, exist_ok=True)
  owner = _read_run_id(directory)
  if owner == run_id:
    return
  if os.listdir(directory):
    if not overwrite:
      what = (f"belongs to run {owner!r}" if owner is not None
              else f"is not empty and has no {RUN_FILE}")
      raise RunMismatch(f"{directory}: {what}; this run is {run_id!r}. Use another directory "
                        "or pass overwrite=True to delete its contents.")
    for entry in os.listdir(directory):
      path = os.path.join(directory, entry)
      shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
  tmp = os.path.join(directory, f".{RUN_FILE}.tmp")
  with open(tmp, "w") as f:
    json.dump({"run_id": run_id}, f)
  os.replace(tmp, os.path.join(directory, RUN_FILE))


class Checkpointer:
  """Save and restore `TrainState`s under one directory of one run.

  Usage:
    ckpt = Checkpointer(workdir + "/checkpoints", run_id=run_name)
    if ckpt.latest_step() is not None:
      state = ckpt.restore(target)   # target: a TrainState of arrays / ShapeDtypeStructs
    ...
    ckpt.save(state)
    ckpt.close()
  """

  def __init__(self, directory: str, run_id: str,
               options: CheckpointOptions = CheckpointOptions(), *, overwrite: bool = False):
    if not run_id:
      raise ValueError("run_id: must be a non-empty string")
    self.directory = os.path.abspath(directory)
    _claim(self.directory, run_id, overwrite)
    self.run_id = run_id
    self._manager = ocp.CheckpointManager(
        self.directory, item_names=("arrays", "meta"),
        options=ocp.CheckpointManagerOptions(
            max_to_keep=options.max_to_keep, create=True, cleanup_tmp_directories=True,
            enable_async_checkpointing=options.async_save))

  def save(self, state: TrainState) -> None:
    """Save `state` as step `state.step` (in the background with `async_save`).

    Raises:
      CheckpointError: Orbax declined the save (it skips, without a word, any step at or
        below the latest saved one: steps must grow across the run, SFT then RL).
    """
    latest = self.latest_step()
    if latest is not None and int(state.step) <= latest:
      raise CheckpointError(f"{self.directory}: step {int(state.step)} is not after the latest "
                            f"saved step {latest}; checkpoint steps must increase over a run")
    typed = _is_typed_key(state.rng)
    arrays = {"params": state.params, "opt_state": state.opt_state,
              "rng": jax.random.key_data(state.rng) if typed else state.rng}
    meta = {"step": int(state.step), "policy_version": int(state.policy_version),
            "data_position": dict(state.data_position), "run_id": self.run_id,
            "rng_impl": str(jax.random.key_impl(state.rng)) if typed else None}
    saved = self._manager.save(int(state.step), args=ocp.args.Composite(
        arrays=ocp.args.StandardSave(arrays), meta=ocp.args.JsonSave(meta)))
    if not saved:
      raise CheckpointError(f"{self.directory}: Orbax did not save step {int(state.step)}")

  def restore(self, target: TrainState, step: Optional[int] = None) -> TrainState:
    """The state saved at `step` (default: the latest).

    `target.params`, `target.opt_state` and `target.rng` give the tree structure, shapes,
    dtypes and shardings (leaves are arrays or `jax.ShapeDtypeStruct`s with `sharding`; a
    leaf without one is restored onto the sharding it was saved with, which needs the same
    devices); the other fields of `target` are ignored.
    """
    self.wait()
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"{self.directory}: no checkpoint to restore")
    typed = _is_typed_key(target.rng)
    rng = jax.eval_shape(jax.random.key_data, target.rng) if typed else target.rng
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct,
                            {"params": target.params, "opt_state": target.opt_state, "rng": rng})
    out = self._manager.restore(step, args=ocp.args.Composite(
        arrays=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
    arrays, meta = out["arrays"], out["meta"]
    rng = arrays["rng"]
    if typed:
      rng = jax.random.wrap_key_data(rng, impl=meta["rng_impl"])
    return TrainState(step=meta["step"], params=arrays["params"],
                      opt_state=arrays["opt_state"], rng=rng,
                      data_position=meta["data_position"],
                      policy_version=meta["policy_version"])

  def meta(self, step: Optional[int] = None) -> dict:
    """The JSON metadata of a saved step (step, policy_version, data_position, run_id), read
    without the arrays: what a caller needs to build the restore target."""
    self.wait()
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"{self.directory}: no checkpoint to read")
    return self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def wait(self) -> None:
    """Block until a background save has been committed."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.close()

  def __enter__(self) -> "Checkpointer":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
