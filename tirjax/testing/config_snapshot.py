"""The resolved config of every estimator config × preset, pinned (issue 39).

    python -m tirjax.testing.config_snapshot          # rewrites tests/config_snapshot.json

`tests/test_config_snapshot.py` rebuilds every case and compares it with the file, naming each
key whose value changed; rewrite the file only for a change made on purpose, and say which
values changed in the commit. Per estimator the file holds its `model=tiny` config whole and,
for each other preset, the keys that differ from it; a case whose `resolve` fails holds its
error instead.
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

from tirjax import rundir
from tirjax.env import environments
from tirjax.testing import short_runs
from tirjax.testing.short_runs import CONFIGS
from tirjax.trainer import resolve

ROOT = pathlib.Path(__file__).resolve().parents[2]
PATH = ROOT / "tests" / "config_snapshot.json"
BASE = "model=tiny"
PRESETS = ("model=tiny,env=doors", "model=tiny,env=bfcl", "model=tiny,env=toolhop",
           "model=tiny,env=ftrl", "model=qwen3_1p7b", "model=qwen3_0p6b,env=bfcl",
           "model=tiny,smoke=1", "model=tiny,rollout=tree", "model=tiny,rollout=arpo",
           "model=tiny,mesh=-1x1x1,steps=7")
# the environments read from dataset files
DATASET_ENVS = tuple(n for n in environments.names() if environments.get(n).load is not None)


def case(name: str, arg: str) -> dict[str, Any]:
  """{"values": flat config} of `configs/<name>.py:<arg>` once `resolve` accepts it, or
  {"error": its message}. A real model or a dataset gets a checkpoint path (".") and no SFT,
  as a user gives them."""
  config = short_runs.config(name, arg)
  with config.unlocked():
    if "qwen" in arg or any(f"env={e}" in arg for e in DATASET_ENVS):
      config.model.hf_checkpoint = "."
    if any(f"env={e}" in arg for e in DATASET_ENVS):
      config.sft.steps = 0
  try:
    resolve.resolve(config)
  except (resolve.ConfigError, ValueError, TypeError, KeyError) as e:
    return {"error": f"{type(e).__name__}: {e}"}
  return {"values": json.loads(json.dumps(rundir.flatten(resolve.config_record(config)),
                                          default=str))}


def diff(base: dict, other: dict) -> dict:
  missing = object()
  return {k: other.get(k) for k in sorted(set(base) | set(other))
          if base.get(k, missing) != other.get(k, missing)}


def snapshot() -> dict:
  out = {}
  for name in CONFIGS:
    base = case(name, BASE)
    entry = {BASE: base}
    for arg in PRESETS:
      c = case(name, arg)
      entry[arg] = c if "error" in c or "error" in base else {"differs": diff(base["values"],
                                                                             c["values"])}
    out[name] = entry
  return out


def main() -> None:
  PATH.write_text(json.dumps(snapshot(), indent=1, sort_keys=True) + "\n")
  print(f"wrote {PATH}", file=sys.stderr)


if __name__ == "__main__":
  main()
