"""Checksums of a train state's arrays and metadata: written at save, verified at restore.

Orbax checks a checkpoint's structure but not its bytes: a flipped byte in an array's data can
restore as different numbers without a word. So each save records a SHA-256 of every array
leaf (its path, dtype, shape and values) and one of the metadata itself, and a restore
recomputes them over what it read. The sums cover values, not files, so a state saved on one
device mesh verifies when restored onto another. Leaves are read to the host to be hashed
(one extra device-to-host copy per save, as Orbax's own save makes), which needs every array
fully addressable: a multi-process run is verified leaf by leaf where it is, and otherwise
only structurally (`None` sums).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Optional

import jax
import numpy as np


def array_sums(tree: Any) -> Optional[dict[str, str]]:
  """{leaf path: SHA-256 hex of dtype, shape and bytes}, or None if a leaf is not addressable."""
  sums = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
      return None
    value = np.ascontiguousarray(jax.device_get(leaf))
    h = hashlib.sha256(f"{value.dtype.str}{value.shape}".encode())
    h.update(value.tobytes())
    sums[jax.tree_util.keystr(path)] = h.hexdigest()
  return sums


def meta_sum(meta: dict) -> str:
  """SHA-256 of the metadata's canonical JSON, without its own `meta_sum` field."""
  body = {k: v for k, v in meta.items() if k != "meta_sum"}
  return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def mismatches(saved: Optional[dict[str, str]], restored: Optional[dict[str, str]]) -> list[str]:
  """Leaf paths whose sums differ (or that only one side has); [] when either side is None."""
  if saved is None or restored is None:
    return []
  return sorted(p for p in set(saved) | set(restored) if saved.get(p) != restored.get(p))
