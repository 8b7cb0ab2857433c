"""Device mesh and shardings: arrays by logical axis names, batches over the data axes.

The one place for meshes and logical-axis rules. A mesh has named axes (default `data`,
`fsdp`, `tensor`) whose sizes come from the config, one of them possibly -1 ("the rest of the
devices"). Arrays name their dimensions with *logical* axes (`batch`, `embed`, `mlp`, `heads`,
...); rules kept in the config (`ShardingOptions.rules`) map each logical axis to mesh axes,
as `flax.linen.logical_to_mesh_axes` does:

    opts = ShardingOptions(mesh=(("data", -1), ("fsdp", 2), ("tensor", 1)))
    mesh = make_mesh(opts)
    model = decoder.init(cfg, rules=opts.rules)        # activations constrained by the rules
    shard_model(model, mesh, opts.rules)                # parameters by their logical names
    opt_state = jax.device_put(opt_state, opt_state_shardings(tx, opt_state, param_shardings))
    batch = shard_batch(rollouts, mesh, opts.rules)     # rows over (data, fsdp)
    with jax.set_mesh(mesh):                            # `constrain` reads the current mesh
      ...

Two ways to name the logical axes of parameters: a pytree of tuples of logical names
(`param_shardings`, `shard_params`; every named dimension must divide over its mesh axes, or
it is an error naming the array), or the `out_sharding` metadata of Flax NNX variables
(`state_shardings`, `shard_model`; a dimension its mesh axes do not divide stays replicated,
so a tiny test model runs on any mesh).

Multi-host (one process per host; `tirjax.distributed`, tested as CPU processes with gloo): call
`jax.distributed.initialize()` first thing in every process (on TPU pods and SLURM the
coordinator, process count and id are discovered; elsewhere pass `coordinator_address`,
`num_processes`, `process_id`). Then `jax.devices()` lists the devices of all hosts and
`make_mesh` spans them. Each process feeds only its own rows: `shard_batch` takes the
*process-local* batch (B / num_processes rows when the batch axes span all processes) and
assembles the global array with `jax.make_array_from_process_local_data`. Create parameters
and optimizer state already sharded, `jax.jit(init, out_shardings=param_shardings(...))`, or
pass the same host value on every process to `shard_params`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Optional, Sequence, Union

import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from tirjax import option_checks

MeshAxes = tuple[tuple[str, int], ...]
RuleAxes = Union[None, str, tuple[str, ...]]
Rules = tuple[tuple[str, RuleAxes], ...]

DEFAULT_MESH: MeshAxes = (("data", -1), ("fsdp", 1), ("tensor", 1))
# Logical names used by the decoder (`tirjax.models`) and the batch:
#   batch, length            activations only
#   vocab, embed, mlp        embedding rows, model width, SwiGLU width
#   heads, kv_heads, head_dim  attention
#   layers                   the stacked (scanned) layer axis of every layer parameter
# A mesh axis already taken by an earlier dimension of the same array is skipped, so `embed`
# shards parameters over fsdp while activations, whose batch dimension already took fsdp,
# keep their width replicated.
DEFAULT_RULES: Rules = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("layers", None),
)
BATCH_AXIS = "batch"


@dataclasses.dataclass(frozen=True)
class ShardingOptions:
  """Mesh axes `((name, size), ...)` (size -1: the rest of the devices) and logical rules.

  A rule `(logical, mesh_axes)` maps a logical axis name to a mesh axis, a tuple of mesh axes,
  or None (replicated). A logical name may have several rules: the first that still has a
  usable mesh axis wins (see `logical_to_spec`). Logical names without a rule are replicated.
  """

  mesh: MeshAxes = DEFAULT_MESH  # the mesh's axes, ((name, size), ...); size -1: the rest
  rules: Rules = DEFAULT_RULES  # (logical axis, mesh axes or None) rules, the first usable wins
  num_devices: int = 0  # 0: every device; n: the first n devices (e.g. a test or a debug run)

  def __post_init__(self):
    option_checks.int_at_least("num_devices", self.num_devices, 0)
    for rule in self.rules:
      if not (isinstance(rule, (list, tuple)) and len(rule) == 2):
        raise ValueError(f"rules: each rule is (logical_name, mesh_axes), got {rule!r}")
    # Configs give lists; store tuples so the options stay hashable.
    mesh = tuple((name, size) for name, size in self.mesh)
    rules = tuple((name, tuple(ax) if isinstance(ax, (list, tuple)) else ax)
                  for name, ax in self.rules)
    object.__setattr__(self, "mesh", mesh)
    object.__setattr__(self, "rules", rules)
    names = [n for n, _ in mesh]
    if not names or len(set(names)) != len(names) or not all(isinstance(n, str) for n in names):
      raise ValueError(f"mesh: axis names must be distinct strings, got {names}")
    for name, size in mesh:
      if not (isinstance(size, int) and (size >= 1 or size == -1)):
        raise ValueError(f"mesh: axis '{name}' has size {size!r}; sizes are ints >= 1, or -1 "
                         "for the rest of the devices")
    if sum(size == -1 for _, size in mesh) > 1:
      raise ValueError(f"mesh: at most one axis may have size -1, got {mesh}")
    for logical, axes in rules:
      if not isinstance(logical, str):
        raise ValueError(f"rules: logical axis names are strings, got {logical!r}")
      for ax in _as_tuple(axes):
        if ax not in names:
          raise ValueError(f"rules: logical axis '{logical}' maps to mesh axis {ax!r}, which "
                           f"is not one of the mesh axes {names}")


def _as_tuple(axes) -> tuple:
  if axes is None:
    return ()
  return tuple(axes) if isinstance(axes, tuple) else (axes,)


def mesh_shape(axes: MeshAxes, num_devices: int) -> tuple[int, ...]:
  """Resolves a -1 size to the remaining devices; the product must equal `num_devices`."""
  known = math.prod(size for _, size in axes if size != -1)
  if any(size == -1 for _, size in axes):
    if num_devices % known:
      raise ValueError(f"mesh: {num_devices} devices do not divide into {axes} (the fixed "
                       f"axes need a multiple of {known})")
    return tuple(num_devices // known if size == -1 else size for _, size in axes)
  if known != num_devices:
    raise ValueError(f"mesh: the axis sizes {axes} multiply to {known}, but {num_devices} "
                     "devices are in use; give a device subset or use -1 for one axis")
  return tuple(size for _, size in axes)


def make_mesh(opts: ShardingOptions = ShardingOptions(),
              devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
  """The mesh of `opts.mesh` over `devices` (default: all devices, of all processes).

  With all devices, the device order follows the physical topology (`jax.make_mesh`); a
  subset is laid out in the order given. Axes are `AxisType.Auto` (GSPMD propagation; the
  decoder's activation constraints are written for Auto axes).
  """
  if devices is None and opts.num_devices:
    if opts.num_devices > jax.device_count():
      raise ValueError(f"num_devices: {opts.num_devices} requested, {jax.device_count()} exist")
    devices = jax.devices()[:opts.num_devices]
  all_devices = devices is None
  devices = list(jax.devices() if all_devices else devices)
  shape = mesh_shape(opts.mesh, len(devices))
  names = tuple(name for name, _ in opts.mesh)
  types = (AxisType.Auto,) * len(names)
  if all_devices:
    return jax.make_mesh(shape, names, axis_types=types)
  return Mesh(np.asarray(devices, dtype=object).reshape(shape), names, axis_types=types)


def logical_to_spec(names: Sequence[Optional[str]], rules: Rules = DEFAULT_RULES,
                    mesh_axes: Optional[Mapping[str, int]] = None,
                    shape: Optional[Sequence[int]] = None) -> PartitionSpec:
  """Partition spec of an array whose dimensions carry these logical names.

  Each dimension tries the rules of its logical name in order. A rule's mesh axes lose those
  an earlier dimension of the same array already took (a mesh axis shards one dimension at
  most) and, given `mesh_axes`, those the mesh lacks; given `shape` too, a rule whose
  remaining axes do not divide the dimension is passed over. The first rule left with axes
  wins; with none, the dimension is replicated. Examples with `DEFAULT_RULES`:
  `("embed", "mlp")` → `P("fsdp", "tensor")`; `("batch", "length", "embed")` →
  `P(("data", "fsdp"), None, None)`.

  Args:
    names: one logical name (or None) per dimension.
    rules: (logical name, mesh axis / tuple of mesh axes / None) pairs.
    mesh_axes: mesh axis name → size; None: every axis named by the rules exists.
    shape: the array shape (requires `mesh_axes`).
  """
  if shape is not None and mesh_axes is None:
    raise ValueError("logical_to_spec: `shape` needs `mesh_axes` (the sizes to divide by)")
  used: set[str] = set()
  spec = []
  for d, name in enumerate(names):
    chosen: tuple[str, ...] = ()
    for logical, axes in rules:
      if name is None or logical != name:
        continue
      axes = tuple(a for a in _as_tuple(axes)
                   if a not in used and (mesh_axes is None or a in mesh_axes))
      if axes and (shape is None or shape[d] % math.prod(mesh_axes[a] for a in axes) == 0):
        chosen = axes
        break
    used.update(chosen)
    spec.append(None if not chosen else chosen[0] if len(chosen) == 1 else chosen)
  return PartitionSpec(*spec)


def _mesh_axes(mesh) -> dict[str, int]:
  return dict(zip(mesh.axis_names, mesh.axis_sizes))


def _is_axes(x) -> bool:
  return isinstance(x, PartitionSpec) or (
      type(x) is tuple and all(a is None or isinstance(a, str) for a in x))


def param_shardings(logical_axes: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Any:
  """A pytree of `NamedSharding`s from a pytree of logical-axis tuples (or logical specs).

  Leaves of `logical_axes` are tuples of logical names or None (one per dimension; `()` for
  a scalar or an unannotated array) or `PartitionSpec`s of logical names, as returned by
  `nnx.get_partition_spec`.
  """
  axes = _mesh_axes(mesh)
  return jax.tree.map(lambda ax: NamedSharding(mesh, logical_to_spec(tuple(ax), rules, axes)),
                      logical_axes, is_leaf=_is_axes)


def _check_divisible(path, x, sharding: NamedSharding) -> None:
  shape = np.shape(x)
  spec = tuple(sharding.spec)
  if len(spec) > len(shape):
    raise ValueError(f"{jax.tree_util.keystr(path)}: shape {shape} has fewer dimensions than "
                     f"its logical axes ({len(spec)} named, spec {sharding.spec})")
  for dim, (size, axes) in enumerate(zip(shape, spec)):
    n = math.prod(sharding.mesh.shape[a] for a in _as_tuple(axes))
    if size % n:
      raise ValueError(f"{jax.tree_util.keystr(path)}: dimension {dim} of shape {shape} has "
                       f"size {size}, not divisible by mesh axes {axes} of total size {n}")


def shard_params(params: Any, logical_axes: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Any:
  """Places `params` on `mesh` by their logical axes; every sharded dimension must divide."""
  shardings = param_shardings(logical_axes, mesh, rules)
  jax.tree_util.tree_map_with_path(_check_divisible, params, shardings)
  return jax.device_put(params, shardings)


def _names(v: nnx.Variable, ndim: int) -> tuple:
  names = v.get_metadata().get("out_sharding") or ()
  return tuple(names) + (None,) * (ndim - len(names))


def state_shardings(state: nnx.State, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> nnx.State:
  """A `NamedSharding` for every Variable of an `nnx.State` (abstract or concrete), from its
  `out_sharding` logical names; dimensions their mesh axes do not divide stay replicated."""
  axes = _mesh_axes(mesh)

  def one(v):
    shape = v.get_value().shape
    return v.replace(NamedSharding(
        mesh, logical_to_spec(_names(v, len(shape)), rules, axes, shape)))

  return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def shard_model(model: nnx.Module, mesh: Mesh, rules: Optional[Rules] = None) -> nnx.Module:
  """Places `model`'s variables on `mesh` (rules default to the model's `rules`)."""
  rules = model.rules if rules is None else rules
  state = nnx.state(model)
  nnx.update(model, jax.device_put(state, state_shardings(state, mesh, rules)))
  return model


def constrain(x: jax.Array, names: Sequence[Optional[str]], rules: Rules) -> jax.Array:
  """`with_sharding_constraint` by logical names under the current mesh (`jax.set_mesh`);
  the identity without one. Dimensions their mesh axes do not divide stay replicated."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  if not mesh.are_all_axes_auto:
    raise ValueError(f"constrain: the model is annotated for meshes with Auto axes, got axis "
                     f"types {mesh.axis_types}; build the mesh with sharding.make_mesh")
  return jax.lax.with_sharding_constraint(
      x, logical_to_spec(names, rules, _mesh_axes(mesh), x.shape))


def opt_state_shardings(tx: optax.GradientTransformation, opt_state: Any,
                        param_shardings_tree: Any) -> Any:
  """Shardings of an optax state: every copy of the params tree inside it (moments, traces)
  takes the params' shardings; everything else (step counts, scalars) is replicated.

  `opt_state` may be concrete or abstract (`jax.eval_shape(tx.init, params)`). The params
  copies are located with `optax.tree_map_params`, which re-runs `tx.init` on a placeholder.
  """
  mesh = jax.tree.leaves(param_shardings_tree)[0].mesh
  replicated = NamedSharding(mesh, PartitionSpec())
  return optax.tree_map_params(tx, lambda _, s: s, opt_state, param_shardings_tree,
                               transform_non_params=lambda _: replicated)


def batch_spec(rules: Rules = DEFAULT_RULES) -> PartitionSpec:
  """`P(<mesh axes of "batch">)`: leading axis sharded, the others replicated."""
  return logical_to_spec((BATCH_AXIS,), rules)


def _local_batch_shards(mesh: Mesh, batch_axes: tuple[str, ...]) -> int:
  """Distinct positions along the batch axes among this process's devices."""
  pos = [mesh.axis_names.index(a) for a in batch_axes]
  me = jax.process_index()
  return len({tuple(idx[p] for p in pos) for idx in np.ndindex(mesh.devices.shape)
              if mesh.devices[idx].process_index == me})


def local_batch_shards(mesh: Mesh, rules: Rules = DEFAULT_RULES) -> int:
  """How many blocks of a batch-sharded array's rows this process's devices hold."""
  return _local_batch_shards(mesh, _as_tuple(batch_spec(rules)[0]))


def shard_batch(batch: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Any:
  """Places a batch pytree (`Rollouts`, `Advantages`, arrays) with its leading axis over the
  batch mesh axes and every other axis replicated.

  `batch` holds this process's rows (the whole batch on a single host); the global arrays
  are assembled with `jax.make_array_from_process_local_data`. Every leaf must have the same
  leading size, divisible by the number of batch shards on this process.
  """
  spec = batch_spec(rules)
  axes = _as_tuple(spec[0])
  leaves = jax.tree_util.tree_leaves_with_path(batch)
  if not leaves:
    return batch
  shards = _local_batch_shards(mesh, axes)
  rows = None
  for path, x in leaves:
    shape = np.shape(x)
    if not shape:
      raise ValueError(f"shard_batch: {jax.tree_util.keystr(path)} is a scalar; every leaf "
                       "needs a leading batch axis")
    rows = shape[0] if rows is None else rows
    if shape[0] != rows:
      raise ValueError(f"shard_batch: {jax.tree_util.keystr(path)} has {shape[0]} rows, other "
                       f"leaves have {rows}")
  if rows % shards:
    raise ValueError(f"shard_batch: {rows} rows do not divide over the {shards} batch shards "
                     f"of mesh axes {axes} {dict(mesh.shape)}; pad the batch to a multiple of "
                     f"{shards}")
  sharding = NamedSharding(mesh, spec)
  return jax.tree.map(
      lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), batch)
