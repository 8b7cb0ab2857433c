"""Logical axis names → mesh partition specs (rules from `ModelConfig.axis_rules`).

Parameters carry their logical names as `out_sharding` metadata (unresolved: a model built
without a mesh is an ordinary single-device model); activations are constrained with
`constrain`, a no-op unless a mesh is set with `jax.set_mesh`. Meshes use `Auto` axes
(`make_mesh`): XLA propagates shardings between the annotated points. Resolution, per array:

* each dimension takes the mesh axes of the first rule naming it, minus mesh axes that an
  earlier dimension of the same array already took and axes the mesh does not have;
* a dimension whose size the chosen axes do not divide is left replicated (tiny models run on
  any mesh).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import jax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from tirjax.models.config import MeshAxes


def logical_to_spec(names: Sequence[Optional[str]], rules: Sequence[tuple[str, MeshAxes]],
                    mesh_axes: dict[str, int], shape: Optional[Sequence[int]] = None
                    ) -> PartitionSpec:
  """PartitionSpec for an array whose dimensions carry logical `names`.

  Args:
    names: one logical name (or None) per dimension.
    rules: (logical name, mesh axis / tuple of mesh axes / None), first match wins.
    mesh_axes: mesh axis name → size.
    shape: the array shape; dimensions the chosen axes do not divide stay replicated.
  """
  table = {}
  for name, axes in rules:
    table.setdefault(name, axes)
  used: set[str] = set()
  spec = []
  for d, name in enumerate(names):
    axes = table.get(name) if name is not None else None
    axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
    axes = tuple(a for a in axes if a in mesh_axes and a not in used)
    if shape is not None and shape[d] % math.prod(mesh_axes[a] for a in axes):
      axes = ()
    used.update(axes)
    spec.append(None if not axes else axes[0] if len(axes) == 1 else axes)
  return PartitionSpec(*spec)


def make_mesh(axis_shapes: Sequence[int], axis_names: Sequence[str] = ("data", "fsdp", "tensor"),
              devices=None) -> jax.sharding.Mesh:
  """A device mesh with `Auto` axes (the sharding mode this model is annotated for)."""
  return jax.make_mesh(tuple(axis_shapes), tuple(axis_names), devices=devices,
                       axis_types=(jax.sharding.AxisType.Auto,) * len(axis_names))


def _mesh_axes(mesh) -> dict[str, int]:
  return dict(zip(mesh.axis_names, mesh.axis_sizes))


def constrain(x: jax.Array, names: Sequence[Optional[str]], rules) -> jax.Array:
  """`with_sharding_constraint` by logical names under the current mesh; identity without one."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  if not mesh.are_all_axes_auto:
    raise ValueError(f"constrain: the model is annotated for meshes with Auto axes, got axis "
                     f"types {mesh.axis_types}; build the mesh with sharding.make_mesh")
  return jax.lax.with_sharding_constraint(
      x, logical_to_spec(names, rules, _mesh_axes(mesh), x.shape))


def _names(v: nnx.Variable, ndim: int) -> tuple:
  names = v.get_metadata().get("out_sharding") or ()
  return tuple(names) + (None,) * (ndim - len(names))


def state_shardings(state, mesh: jax.sharding.Mesh, rules):
  """NamedSharding for every Variable of an `nnx.State` (abstract or concrete)."""
  axes = _mesh_axes(mesh)

  def one(v):
    shape = v.get_value().shape
    return v.replace(NamedSharding(
        mesh, logical_to_spec(_names(v, len(shape)), rules, axes, shape)))

  return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def shard_model(model: nnx.Module, mesh: jax.sharding.Mesh, rules=None) -> nnx.Module:
  """Place `model`'s variables on `mesh` following the rules (default: the model's config)."""
  rules = model.config.axis_rules if rules is None else rules
  state = nnx.state(model)
  nnx.update(model, jax.device_put(state, state_shardings(state, mesh, rules)))
  return model
