"""The same batch with its rows moved or its padded shape grown, for invariance tests.

Rows move with `rollouts.take_rows`; axes grow with `widen`, each field padded with the
contract's padding value along the contract's axes (`rollouts.fill_value`, `field_axes`).
"""

from __future__ import annotations

import numpy as np

from tirjax.rollouts import Rollouts, field_axes, fill_value, from_numpy, take_rows


def move_rows(r, positions, num_rows: int) -> dict[str, np.ndarray]:
  """Row b of `r` (a `Rollouts` or `to_numpy`'s arrays) at `positions[b]` of a `num_rows`
  batch, the other rows padding; numpy arrays in `to_numpy`'s layout."""
  source = np.full(num_rows, -1, np.int64)
  source[np.asarray(positions, np.int64)] = np.arange(len(positions))
  return take_rows(r, source, num_rows)


def widen(arrays: dict, **sizes: int) -> dict[str, np.ndarray]:
  """`arrays` (`to_numpy`'s layout) with the axes named in `sizes` (T, K, C, L or P) grown to
  those sizes, the new slots padding. Rows move with `take_rows`, not here."""
  unknown = set(sizes) - set("TKCLP")
  if unknown:
    raise ValueError(f"widen: sizes must name axes among T, K, C, L, P, got {sorted(unknown)}")
  out = {}
  for name, x in arrays.items():
    shape = tuple(sizes.get(axis, n) for axis, n in zip(field_axes(name), x.shape))
    if any(new < old for new, old in zip(shape, x.shape)):
      raise ValueError(f"widen: {name} of shape {x.shape} does not fit {shape}")
    grown = np.full(shape, fill_value(name), x.dtype)
    grown[tuple(slice(0, n) for n in x.shape)] = x
    out[name] = grown
  return out


def permute_rows(r: Rollouts, perm) -> Rollouts:
  """The same batch with its rows reordered: row i of the result is row perm[i]."""
  return from_numpy(take_rows(r, perm, r.num_rows))


def pad(r: Rollouts, rng: np.random.Generator, extra_rows: int, extra_steps: int = 0,
        extra_calls: int = 0, extra_gt: int = 0, extra_tokens: int = 0):
  """The batch with padding rows inserted at random positions and larger T, K, C, L.

  Padding rows get random in-range group ids. Returns (padded batch, index of each original
  row in it).
  """
  B = r.num_rows
  B2 = B + extra_rows
  rows = np.sort(rng.choice(B2, B, replace=False))
  a = move_rows(r, rows, B2)
  padding = np.ones(B2, bool)
  padding[rows] = False
  a["group_id"] = np.where(padding, rng.integers(0, B2, B2), a["group_id"])
  a = widen(a, T=r.max_steps + extra_steps, K=r.max_calls + extra_calls,
            C=r.max_gt_calls + extra_gt, L=r.max_tokens + extra_tokens)
  return from_numpy(a), rows
