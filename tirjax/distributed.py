"""Multi-process training on JAX's multi-controller runtime (spec §9): one process per host
(or per GPU), every process running the same program.

    initialize(DistributedOptions(num_processes=2, process_id=p,
                                  coordinator_address="host0:1234"))   # before any JAX work
    mesh = sharding.make_mesh(opts)              # spans every process's devices
    share = row_share(mesh, rules, global_rows)  # this process's rows of the global batch
    local = rollout(..., share.of(tasks), ..., first_query=...)  # sampled here only
    batch = sharding.shard_batch(local, mesh, rules)  # make_array_from_process_local_data

What each process does alone, and what every process must do together:

* Alone: sampling (its share of the step's queries, with its own sampler on its own devices),
  environment steps, judging, host metrics of its rows.
* Together (collectives, in the same order on every process): the estimator, the reference
  log-probs and the update on the global batch; checkpoint saves and restores (Orbax writes
  each process's shards); gathering a process-local replica of the weights for the sampler and
  the export; gathering the evaluation's episodes (each process runs its block of the eval
  tasks); `barrier`, `agree`, `reduce_stats` and `allgather_objects`.
* Process 0 only: the run directory's files (config, status, metrics, TensorBoard, summary,
  the HF export).

With one process (`num_processes=1`, the default) every function here is the identity or a
no-op, so the single-process trainer runs the same code.
"""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any, Literal, Mapping, NamedTuple, Sequence, get_args

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

from tirjax import option_checks
from tirjax import sharding as sharding_lib

CpuCollectives = Literal["gloo", "mpi", "none"]
CPU_COLLECTIVES = get_args(CpuCollectives)


@dataclasses.dataclass(frozen=True)
class DistributedOptions:
  """How this process joins a multi-process run (`jax.distributed.initialize`).

  Attributes:
    num_processes: 1: a single process (nothing is initialised); n > 1: n processes, with
      `coordinator_address` and `process_id` given (or found by JAX in a Slurm or Open MPI
      job); 0: everything auto-detected, as on a TPU pod slice or in a Slurm job.
    coordinator_address: `host:port` of process 0's coordinator ("" = auto-detected).
    process_id: this process, 0 ≤ id < num_processes (-1 = auto-detected).
    cpu_collectives: the CPU backend's cross-process collectives ("gloo" runs anywhere;
      GPUs and TPUs use their own, this only matters for CPU devices).
  """

  num_processes: int = 1
  coordinator_address: str = ""
  process_id: int = -1
  cpu_collectives: CpuCollectives = "gloo"

  def __post_init__(self):
    option_checks.int_at_least("num_processes", self.num_processes, 0)
    option_checks.int_at_least("process_id", self.process_id, -1)
    if self.num_processes > 1 and self.process_id >= self.num_processes:
      raise ValueError(f"process_id: {self.process_id} is not below num_processes="
                       f"{self.num_processes}")
    option_checks.typed_choices(self)
    if self.coordinator_address and ":" not in self.coordinator_address:
      raise ValueError(f"coordinator_address: must be host:port, got "
                       f"{self.coordinator_address!r}")

  @property
  def enabled(self) -> bool:
    return self.num_processes != 1


def initialize(opts: DistributedOptions) -> None:
  """`jax.distributed.initialize` from `opts` (nothing with one process). Call it before
  anything that touches JAX's devices; a second call with the runtime up is a no-op."""
  if not opts.enabled or jax.distributed.is_initialized():
    return
  jax.config.update("jax_cpu_collectives_implementation", opts.cpu_collectives)
  kwargs = {}
  if opts.num_processes > 1:
    kwargs["num_processes"] = opts.num_processes
  if opts.coordinator_address:
    kwargs["coordinator_address"] = opts.coordinator_address
  if opts.process_id >= 0:
    kwargs["process_id"] = opts.process_id
  jax.distributed.initialize(**kwargs)
  if opts.num_processes > 1 and jax.process_count() != opts.num_processes:
    raise RuntimeError(f"distributed: {jax.process_count()} processes joined, "
                       f"num_processes={opts.num_processes} were configured")


def is_multiprocess() -> bool:
  return jax.process_count() > 1


def is_primary() -> bool:
  """Process 0: the one that writes the run directory's files."""
  return jax.process_index() == 0


def barrier(name: str) -> None:
  """Every process waits here until all have arrived (a no-op with one process)."""
  if is_multiprocess():
    multihost_utils.sync_global_devices(name)


def agree(value: Any) -> Any:
  """Process 0's `value` (a scalar or array pytree) on every process."""
  if not is_multiprocess():
    return value
  return jax.tree.map(lambda x: np.asarray(x).item() if np.ndim(x) == 0 else np.asarray(x),
                      multihost_utils.broadcast_one_to_all(value))


def global_max(value: int) -> int:
  """The largest of every process's `value`."""
  if not is_multiprocess():
    return int(value)
  return int(np.max(multihost_utils.process_allgather(np.int64(value))))


def global_maxima(values) -> list[int]:
  """Each entry's largest value over every process (one collective for all of them)."""
  values = np.asarray(values, np.int64)
  if not is_multiprocess():
    return values.tolist()
  return np.max(multihost_utils.process_allgather(values), axis=0).tolist()


def allgather_objects(obj: Any) -> list:
  """Every process's picklable `obj`, in process order (`[obj]` with one process): host
  results too ragged for an array, such as a process's evaluation episodes."""
  if not is_multiprocess():
    return [obj]
  data = np.frombuffer(pickle.dumps(obj), np.uint8)
  sizes = multihost_utils.process_allgather(np.int32(data.size))
  padded = np.zeros(int(np.max(sizes)), np.uint8)
  padded[:data.size] = data
  gathered = multihost_utils.process_allgather(padded)
  return [pickle.loads(gathered[p, :int(sizes[p])].tobytes()) for p in range(len(sizes))]


def task_block(num_tasks: int) -> tuple[int, int]:
  """This process's contiguous block `[start, stop)` of `num_tasks` (blocks differ by at most
  one task; all of them with one process)."""
  bounds = np.linspace(0, num_tasks, jax.process_count() + 1).round().astype(int)
  return int(bounds[jax.process_index()]), int(bounds[jax.process_index() + 1])


class RowShare(NamedTuple):
  """This process's block of the global batch: rows `[start, stop)`, and its position
  `index` among `count` equal blocks (the order of the global batch's row blocks)."""

  index: int
  count: int
  start: int
  stop: int

  def of(self, items: Sequence) -> list:
    """This process's equal share of `items` (their number must divide by `count`)."""
    if len(items) % self.count:
      raise ValueError(f"{len(items)} items do not divide over {self.count} processes")
    per = len(items) // self.count
    return list(items[self.index * per:(self.index + 1) * per])


def row_share(mesh, rules, global_rows: int) -> RowShare:
  """Where this process's rows lie in a `[global_rows, ...]` batch sharded over the batch
  mesh axes: one contiguous block of `global_rows / processes` rows.

  Raises:
    ValueError: the batch axes do not split the processes (two processes would hold the same
      rows, or one process rows in several places).
  """
  spec = sharding_lib.batch_spec(rules)
  rows = set()
  for index in NamedSharding(mesh, spec).addressable_devices_indices_map(
      (global_rows,)).values():
    rows.update(range(*index[0].indices(global_rows)))
  count = jax.process_count()
  per, start = global_rows // count, min(rows)
  if global_rows % count or rows != set(range(start, start + per)) or start % per:
    raise ValueError(
        f"sharding: the batch mesh axes {spec[0]} must give each of the {count} processes its "
        f"own block of {global_rows} / {count} rows (this process holds {len(rows)} rows from "
        f"{start}); put the data or fsdp axis across hosts (it is outermost by default)")
  return RowShare(index=start // per, count=count, start=start, stop=start + per)


def host_rows(x) -> np.ndarray:
  """Every row of a batch-sharded array on this host (every process gets the same array):
  small per-row fields such as group ids, which every process needs whole."""
  if not isinstance(x, jax.Array) or x.is_fully_addressable:
    return np.asarray(x)
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def local_rows(x: jax.Array) -> np.ndarray:
  """This process's rows of a batch-sharded array, in order (the array itself on one
  process); replicas of the same rows (other mesh axes) are read once."""
  if x.is_fully_addressable:
    return np.asarray(x)
  shards = {}
  for s in x.addressable_shards:
    start = s.index[0].start or 0
    shards.setdefault(start, s.data)
  return np.concatenate([np.asarray(shards[k]) for k in sorted(shards)])


def local_replica(tree: Any) -> Any:
  """A copy of every array of `tree` whole on one device of this process (its first device
  of the arrays' mesh): what the process's own sampler and exporter read, apart from the
  train step, which donates the originals. A collective when arrays span processes (every
  process must call it)."""
  leaves = jax.tree.leaves(tree)
  if all(len(x.sharding.device_set) == 1 for x in leaves):
    return jax.tree.map(jnp.copy, tree)
  mesh = leaves[0].sharding.mesh
  whole = jax.jit(lambda t: jax.tree.map(jnp.copy, t),
                  out_shardings=NamedSharding(mesh, PartitionSpec()))(tree)
  return jax.tree.map(lambda x: x.addressable_data(0), whole)


# How each kind of per-process statistic combines into the run's: counts add up, extremes are
# extremes, seconds and DAPO's refill rounds are the slowest process's (the step waits for
# it), the rest are means of equal shares.
_SUMMED = ("rows/", "rollout/rows", "rollout/prompts", "rollout/sampled_tokens",
           "rollout/sampler_calls", "unlearning/num_necessary")


def _combine(key: str):
  if key.startswith(_SUMMED) or key.endswith("_tokens"):
    return np.sum
  if key.endswith("_min"):
    return np.min
  if key.endswith(("_max", "_s")) or key.startswith("time/") or key == "dapo/extra_rounds":
    return np.max
  return np.mean


def combine_stats(per_process: Sequence[Mapping[str, float]]) -> dict:
  """One dict of statistics from every process's (the same keys on each): counts summed,
  minima and maxima kept, seconds the slowest process's, the rest averaged (equal shares)."""
  out = dict(per_process[0])
  for k in per_process[0]:
    values = [p[k] for p in per_process]
    if all(isinstance(v, (int, float, np.number)) and not isinstance(v, bool) for v in values):
      out[k] = float(_combine(k)(np.asarray(values, np.float64)))
  return out


def reduce_stats(stats: Mapping[str, float]) -> dict:
  """`combine_stats` over every process's `stats`; every process must call it with the same
  keys. One process: unchanged."""
  if not is_multiprocess():
    return dict(stats)
  keys = sorted(k for k, v in stats.items() if isinstance(v, (int, float, np.number))
                and not isinstance(v, bool))
  gathered = multihost_utils.process_allgather(
      np.asarray([float(stats[k]) for k in keys], np.float32))
  return {**stats, **combine_stats([dict(zip(keys, row.tolist())) for row in gathered])}
