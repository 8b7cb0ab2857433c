"""Train-state checkpoints (Orbax): params, optimizer state, step, PRNG key, data position,
policy version, and a critic's parameters and optimizer state where the run has one.

* A checkpoint is complete or absent: Orbax writes each step into a temporary directory and
  renames it into place after everything is written, so a crash during a save leaves the
  previous step as the latest usable one (the partial directory is ignored and cleaned up).
* The last `max_to_keep` steps are kept.
* `restore` places every array on the sharding of the matching target leaf, so a state saved
  on one device mesh restores onto another.
* Every save records SHA-256 sums of its arrays and of its metadata (`checkpoint_sums`); a
  restore verifies them. A step that cannot be read or does not match is reported by name, and
  a restore of the latest step falls back to the newest intact one, moving the corrupt ones
  aside to `corrupt-<step>/` (kept for inspection, never deleted) so that the run can save
  those steps again.
* Once a step is committed, its files are recorded too (`tirjax_files.json`: sizes, and sums
  of the small files); a restore names, in a warning, every recorded file that is missing or
  changed. Those it reads are covered by the sums above; the others (each process's own OCDBT
  b-tree and manifest, the commit markers) change nothing that is restored, so the verified
  state is kept. A step whose save was cut short after its commit has no such record.
* Multi-process runs (`tirjax.distributed`): every process saves and restores together (Orbax
  writes each process's shards); the directory's own files are process 0's to write.
* `on_commit(data_position)` is told of each save once it is committed (at the next save,
  `wait` or `close`; the steps it covers are then never redone: `rundir.MetricsWriter`
  sends them to W&B).
* A directory belongs to one run: it holds a `tirjax_run.json` naming the run id. Opening a
  directory of another run, or a non-empty directory without that file, is an error unless
  `overwrite=True`, which empties it first.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import warnings
from typing import Any, Callable, Mapping, Optional, Union

import jax
import numpy as np
import orbax.checkpoint as ocp

from tirjax import checkpoint_sums, distributed, option_checks

RUN_FILE = "tirjax_run.json"
FILES = "tirjax_files.json"  # in each step's directory


class CheckpointError(RuntimeError):
  """A checkpoint could not be written (or read back), named by its directory and step."""


class CheckpointCorrupt(CheckpointError):
  """A saved step that cannot be read, or whose checksums do not match what was read."""


class RunMismatch(RuntimeError):
  """The checkpoint directory belongs to another run (or is not a tirjax directory)."""


@dataclasses.dataclass(frozen=True)
class CheckpointOptions:
  max_to_keep: int = 3
  async_save: bool = True  # write in a background thread; `wait`/`close` join it

  def __post_init__(self):
    option_checks.at_least("max_to_keep", self.max_to_keep, 1)


@dataclasses.dataclass(frozen=True)
class TrainState:
  """What a training run needs to resume exactly.

  `params` and `opt_state` are pytrees of arrays (e.g. `nnx.state(model, nnx.Param)` and an
  optax state); `rng` is a typed key (`jax.random.key`) or raw uint32 key data;
  `data_position` is JSON (where the data iterator resumes). `critic_params` and
  `critic_opt_state`: the value model's (`tirjax.models.value`), None in a run without one;
  saved, summed and restored like the policy's (under the arrays' key "critic").
  """

  step: int
  params: Any
  opt_state: Any
  rng: jax.Array
  data_position: Mapping[str, Any]
  policy_version: int
  critic_params: Any = None
  critic_opt_state: Any = None

  @property
  def has_critic(self) -> bool:
    return self.critic_params is not None


def _is_typed_key(x) -> bool:
  return jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _read_run_id(directory: str) -> Optional[str]:
  path = os.path.join(directory, RUN_FILE)
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      run_id = json.load(f)["run_id"]
    if not isinstance(run_id, str):
      raise TypeError(f"run_id is a {type(run_id).__name__}")
  except (ValueError, KeyError, TypeError) as e:  # JSONDecodeError is a ValueError
    raise RunMismatch(f"{path}: cannot be read as this directory's run file ({type(e).__name__}: "
                      f"{e}); it should hold {{\"run_id\": ...}}. Restore it, or pass "
                      "overwrite=True to delete the directory's contents.") from e
  return run_id


def _claim(directory: str, run_id: str, overwrite: bool) -> None:
  """Check that `directory` is this run's (or empty); with `overwrite`, empty it first."""
  os.makedirs(directory, exist_ok=True)
  try:
    owner = _read_run_id(directory)
  except RunMismatch:
    if not overwrite:
      raise
    owner = None  # unreadable: emptied below with everything else
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


def _host_if_multiprocess(x):
  """The PRNG key data as a host array in a multi-process run: Orbax writes host arrays from
  process 0, while a device array that is not global would be written by every process."""
  return np.asarray(x) if distributed.is_multiprocess() else x


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
               options: CheckpointOptions = CheckpointOptions(), *, overwrite: bool = False,
               on_commit: Optional[Callable[[dict], None]] = None):
    if not run_id:
      raise ValueError("run_id: must be a non-empty string")
    self.directory = os.path.abspath(directory)
    if distributed.is_primary():  # the files of a multi-process run are process 0's to write
      _claim(self.directory, run_id, overwrite)
    distributed.barrier("checkpoint-claim")
    self.run_id = run_id
    self._on_commit, self._in_flight = on_commit, None  # the data position of a save under way
    self._async = options.async_save
    self._unrecorded: list[int] = []  # steps saved, their files not yet recorded
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
              "rng": _host_if_multiprocess(jax.random.key_data(state.rng) if typed
                                           else state.rng)}
    if state.has_critic:
      arrays["critic"] = {"params": state.critic_params, "opt_state": state.critic_opt_state}
    meta = {"step": int(state.step), "policy_version": int(state.policy_version),
            "data_position": dict(state.data_position), "run_id": self.run_id,
            "rng_impl": str(jax.random.key_impl(state.rng)) if typed else None,
            "sums": checkpoint_sums.array_sums(arrays)}
    if state.has_critic:  # only then: a run without a critic saves what it always saved
      meta["critic"] = True
    meta["meta_sum"] = checkpoint_sums.meta_sum(meta)
    self.wait()  # the previous save (Orbax waits for it before a new one anyway)
    saved = self._manager.save(int(state.step), args=ocp.args.Composite(
        arrays=ocp.args.StandardSave(arrays), meta=ocp.args.JsonSave(meta)))
    if not saved:
      raise CheckpointError(f"{self.directory}: Orbax did not save step {int(state.step)}")
    self._unrecorded.append(int(state.step))
    self._in_flight = meta["data_position"]
    if not self._async:
      self._committed()

  def restore(self, target: Union[TrainState, Callable[[dict], TrainState]],
              step: Optional[int] = None) -> TrainState:
    """The state saved at `step`, or by default the newest intact one.

    `target` (a TrainState, or a function of the step's metadata that returns one, for a
    target that depends on what was saved) gives the tree structure, shapes, dtypes and
    shardings of `params`, `opt_state` and `rng` (leaves are arrays or `jax.ShapeDtypeStruct`s
    with `sharding`; a leaf without one is restored onto the sharding it was saved with, which
    needs the same devices); its other fields are ignored.

    With `step=None`, a step that cannot be read or fails its checksums is reported in a
    warning that names its directory, and the next older step is tried; once one restores,
    the corrupt newer steps are moved aside to `corrupt-<step>/`.

    Raises:
      FileNotFoundError: there is no checkpoint.
      CheckpointCorrupt: the given `step`, or every step, is unreadable or fails its sums.
    """
    self.wait()
    if step is not None:
      return self._restore_verified(target, step)
    steps = sorted(self.steps(), reverse=True)
    if not steps:
      raise FileNotFoundError(f"{self.directory}: no checkpoint to restore")
    corrupt = []
    for s in steps:
      try:
        state = self._restore_verified(target, s)
      except CheckpointCorrupt as e:
        warnings.warn(f"{e}; trying an older checkpoint", RuntimeWarning, stacklevel=2)
        corrupt.append(e)
        continue
      if corrupt:
        moved = [self._move_aside(e.step) for e in corrupt]
        warnings.warn(f"{self.directory}: restored step {s}, the newest intact checkpoint; "
                      f"the corrupt newer ones were moved to {', '.join(moved)}",
                      RuntimeWarning, stacklevel=2)
      return state
    raise CheckpointCorrupt(f"{self.directory}: no intact checkpoint: "
                            + "; ".join(str(e) for e in corrupt))

  def _corrupt(self, step: int, what: str, cause: Optional[BaseException] = None):
    if cause is not None:  # the first line of the cause only: TensorStore's run to pages
      first = (str(cause).splitlines() or [""])[0][:300]
      what += f" ({type(cause).__name__}: {first})"
    err = CheckpointCorrupt(f"{os.path.join(self.directory, str(step))}: {what}")
    err.step = step
    return err

  def _restore_verified(self, target, step: int) -> TrainState:
    meta = self.meta(step)
    tgt = target(meta) if callable(target) else target
    typed = _is_typed_key(tgt.rng)
    rng = jax.eval_shape(jax.random.key_data, tgt.rng) if typed else tgt.rng
    saved_critic = bool(meta.get("critic", False))
    if tgt.has_critic != saved_critic:
      raise ValueError(f"{os.path.join(self.directory, str(step))}: saved "
                       f"{'with' if saved_critic else 'without'} a critic, restored into a state "
                       f"{'with' if tgt.has_critic else 'without'} one")
    trees = {"params": tgt.params, "opt_state": tgt.opt_state}
    if tgt.has_critic:
      trees["critic"] = {"params": tgt.critic_params, "opt_state": tgt.critic_opt_state}
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, trees)
    abstract["rng"] = (np.zeros(rng.shape, rng.dtype) if distributed.is_multiprocess()
                       else ocp.utils.to_shape_dtype_struct(rng))
    try:
      arrays = self._manager.restore(step, args=ocp.args.Composite(
          arrays=ocp.args.StandardRestore(abstract)))["arrays"]
    except Exception as e:  # Orbax and TensorStore raise many kinds; each names no file
      raise self._corrupt(step, "its arrays cannot be read", e) from e
    if "sums" not in meta:
      warnings.warn(f"{os.path.join(self.directory, str(step))}: saved without checksums (by "
                    "an older tirjax); restored unverified", RuntimeWarning, stacklevel=3)
    else:
      bad = checkpoint_sums.mismatches(meta["sums"], checkpoint_sums.array_sums(arrays))
      if bad:
        raise self._corrupt(step, f"checksum mismatch in {len(bad)} array(s), e.g. {bad[0]}")
    self._check_files(step, verified="sums" in meta)
    rng = arrays["rng"]
    if typed:
      rng = jax.random.wrap_key_data(rng, impl=meta["rng_impl"])
    return TrainState(step=meta["step"], params=arrays["params"],
                      opt_state=arrays["opt_state"], rng=rng,
                      data_position=meta["data_position"],
                      policy_version=meta["policy_version"],
                      critic_params=arrays["critic"]["params"] if tgt.has_critic else None,
                      critic_opt_state=arrays["critic"]["opt_state"] if tgt.has_critic else None)

  def meta(self, step: Optional[int] = None) -> dict:
    """The JSON metadata of a saved step (step, policy_version, data_position, run_id, sums),
    read and checked without the arrays: what a caller needs to build the restore target.

    Raises:
      CheckpointCorrupt: the metadata cannot be read, lacks a field or fails its checksum.
    """
    self.wait()
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"{self.directory}: no checkpoint to read")
    try:
      meta = self._manager.restore(step, args=ocp.args.Composite(
          meta=ocp.args.JsonRestore()))["meta"]
    except Exception as e:
      raise self._corrupt(step, "its metadata cannot be read", e) from e
    if not isinstance(meta, dict):
      raise self._corrupt(step, f"its metadata is a {type(meta).__name__}, not an object")
    fields = {"step": int, "policy_version": int, "data_position": dict, "run_id": str}
    for name, kind in fields.items():
      if not isinstance(meta.get(name), kind):
        raise self._corrupt(step, f"its metadata lacks '{name}' ({kind.__name__})")
    if meta["step"] != step:
      raise self._corrupt(step, f"its metadata says step {meta['step']}")
    if ("sums" in meta or "meta_sum" in meta) and (
        meta.get("meta_sum") != checkpoint_sums.meta_sum(meta)):
      raise self._corrupt(step, "its metadata fails its checksum")
    return meta

  def _move_aside(self, step: int) -> str:
    dest = base = os.path.join(self.directory, f"corrupt-{step}")
    n = 1
    while os.path.exists(dest):
      dest, n = f"{base}.{n}", n + 1
    distributed.barrier(f"checkpoint-found-corrupt-{step}")  # every process has looked
    if distributed.is_primary():
      os.rename(os.path.join(self.directory, str(step)), dest)
    distributed.barrier(f"checkpoint-moved-{step}")
    self._manager.reload()
    return dest

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def _record_files(self) -> None:
    """Writes the file record of each committed step saved since the last call (waiting for a
    save in the background to commit first)."""
    self._manager.wait_until_finished()
    steps, self._unrecorded = self._unrecorded, []
    for step in steps:
      step_dir = os.path.join(self.directory, str(step))
      if distributed.is_primary() and os.path.isdir(step_dir):  # not already rotated out
        sums = checkpoint_sums.file_sums(step_dir, exclude=FILES)
        tmp = os.path.join(step_dir, f".{FILES}.tmp")
        with open(tmp, "w") as f:
          json.dump(sums, f)
        os.replace(tmp, os.path.join(step_dir, FILES))

  def _check_files(self, step: int, verified: bool) -> None:
    """Warns about each recorded file of `step` that is missing or changed."""
    step_dir = os.path.join(self.directory, str(step))
    path = os.path.join(step_dir, FILES)
    if not distributed.is_primary() or not os.path.exists(path):
      return
    try:
      with open(path) as f:
        bad = checkpoint_sums.file_mismatches(json.load(f), step_dir)
    except (ValueError, TypeError, AttributeError) as e:
      bad = [f"{FILES}: cannot be read ({type(e).__name__}: {e})"]
    if bad:
      kept = ("the restored arrays and metadata match their checksums, so the state is restored "
              "as saved" if verified else "restored unverified")
      warnings.warn(f"{step_dir}: {len(bad)} file(s) differ from those saved ({'; '.join(bad[:5])}"
                    f"{'; ...' if len(bad) > 5 else ''}); {kept}", RuntimeWarning, stacklevel=4)

  def _committed(self) -> None:
    position, self._in_flight = self._in_flight, None
    if position is not None and self._on_commit is not None:
      self._on_commit(position)

  def wait(self) -> None:
    """Block until a background save has been committed (and its files recorded)."""
    self._record_files()
    self._committed()

  def close(self) -> None:
    self._record_files()
    self._manager.close()
    self._committed()

  def __enter__(self) -> "Checkpointer":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
