"""Checksums of a train state's arrays and metadata: written at save, verified at restore.

Orbax checks a checkpoint's structure but not its bytes: a flipped byte in an array's data can
restore as different numbers without a word. So each save records a SHA-256 of every array
leaf (its path, dtype, shape and values) and one of the metadata itself, and a restore
recomputes them over what it read. The sums cover values, not files, so a state saved on one
device mesh verifies when restored onto another. Leaves are read to the host to be hashed
(one extra device-to-host copy per save, as Orbax's own save makes), which needs every array
fully addressable: a multi-process run is verified leaf by leaf where it is, and otherwise
only structurally (`None` sums).

The value sums cover what a restore reads, and nothing else: Orbax's OCDBT layout also holds
files that a restore never opens (each process's own b-tree nodes and manifest under
`ocdbt.process_N/`, superseded by the merged tree at the top of `arrays/`, and the
`commit_success.txt` markers), so a byte changed there, or such a file deleted, left the
restored arrays intact and went unnoticed. `file_sums` records every file of a committed step
(its size, and the SHA-256 of each file up to `HASHED_BYTES`: larger files hold the arrays'
values, which the value sums verify), and `file_mismatches` names the files that differ.
"""

from __future__ import annotations

import hashlib
import json
import os
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


HASHED_BYTES = 1 << 20  # files up to this size are hashed; larger ones are checked by size


def _file_sum(path: str, size: int) -> Optional[str]:
  if size > HASHED_BYTES:
    return None
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def file_sums(directory: str, exclude: str = "") -> dict[str, list]:
  """{path relative to `directory`: [size, SHA-256 hex or None (over HASHED_BYTES)]} of every
  file under it but `exclude`."""
  sums = {}
  for root, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(root, name)
      rel = os.path.relpath(path, directory)
      if rel != exclude:
        size = os.path.getsize(path)
        sums[rel] = [size, _file_sum(path, size)]
  return sums


def file_mismatches(saved: dict[str, list], directory: str) -> list[str]:
  """"<file>: missing" / "<file>: changed" for each recorded file that is gone or differs."""
  out = []
  for rel, (size, digest) in sorted(saved.items()):
    path = os.path.join(directory, rel)
    if not os.path.isfile(path):
      out.append(f"{rel}: missing")
    elif os.path.getsize(path) != size or _file_sum(path, size) != digest:
      out.append(f"{rel}: changed")
  return out
