"""Host-side encoding of tool calls for the on-device similarity (spec §2).

Each call becomes a tool-name id, a padded set of parameter-name ids and one hash per
parameter value. Parsing and hashing happen here, once per call; `similarity.py` compares the
encodings with array ops. Values compare as decoded JSON: `1 == 1.0`, strings exactly,
booleans are distinct from numbers, objects ignore key order.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Collection, Mapping

import numpy as np

PAD = -1


def canonical_value(v: Any) -> Any:
  """A hashable canonical form of a decoded JSON value (1 and 1.0 coincide)."""
  if isinstance(v, bool) or v is None:
    return ("lit", v)
  if isinstance(v, int):
    return ("num", v)  # exact: 2**53 + 1 and 2.0**53 differ, as they do in Python
  if isinstance(v, float):
    if math.isfinite(v) and v == int(v):
      return ("num", int(v))
    return ("num", repr(v))
  if isinstance(v, str):
    return ("str", v)
  if isinstance(v, (list, tuple)):
    return ("list", tuple(canonical_value(x) for x in v))
  if isinstance(v, Mapping):
    return ("obj", tuple(sorted((str(k), canonical_value(x)) for k, x in v.items())))
  return ("other", repr(v))


def value_hash(v: Any) -> int:
  """A non-negative int32 hash of the canonical value (collision chance ~2^-31 per pair)."""
  digest = hashlib.blake2b(repr(canonical_value(v)).encode(), digest_size=4).digest()
  return int.from_bytes(digest, "little") & 0x7FFFFFFF


class CallEncoder:
  """Maps tool names and parameter names to small integer ids, shared across a batch."""

  def __init__(self):
    self.names: dict[str, int] = {}
    self.keys: dict[str, int] = {}

  def name_id(self, name: str) -> int:
    return self.names.setdefault(name, len(self.names))

  def key_id(self, key: str) -> int:
    return self.keys.setdefault(key, len(self.keys))

  def encode(self, call: Mapping[str, Any], max_params: int):
    """Returns (name_id, key_ids [P], value_hashes [P]) for one `{"name", "arguments"}`."""
    args = call.get("arguments") or {}
    if not isinstance(args, Mapping):
      raise ValueError(f"call {call.get('name')!r}: arguments must be an object, got "
                       f"{type(args).__name__}")
    if len(args) > max_params:
      raise ValueError(f"call {call.get('name')!r} has {len(args)} arguments; max_params is "
                       f"{max_params}")
    keys = np.full(max_params, PAD, np.int32)
    values = np.full(max_params, PAD, np.int32)
    for p, (k, v) in enumerate(sorted(args.items())):
      keys[p] = self.key_id(str(k))
      values[p] = value_hash(v)
    return self.name_id(str(call.get("name"))), keys, values


def direction_slots(call: Mapping[str, Any], max_params: int,
                    directions: Mapping[str, Collection[str]]) -> np.ndarray:
  """[P] bool: which parameter slots of `call`, in `CallEncoder.encode`'s order (sorted
  names), hold a direction: the names `directions[call's tool]` lists (none for a tool it
  does not name). The strict similarity's mask (`similarity.strict_call_similarity`)."""
  args = call.get("arguments") or {}
  if len(args) > max_params:
    raise ValueError(f"call {call.get('name')!r} has {len(args)} arguments; max_params is "
                     f"{max_params}")
  wanted = directions.get(str(call.get("name")), ())
  out = np.zeros(max_params, bool)
  for p, k in enumerate(sorted(args)):
    out[p] = str(k) in wanted
  return out
