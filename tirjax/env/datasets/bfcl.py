"""BFCL multi-turn (Berkeley Function Calling Leaderboard v4) on its executable back-ends.

Data and back-ends come from the `bfcl-eval` package (installed with `--no-deps`): entries
`data/BFCL_v4_<category>.json` (JSON lines), ground truth `data/possible_answer/…` as Python
call strings per user turn (read with `ast`, never `eval`), function docs
`data/multi_turn_func_doc/*.json`, and the stateful classes (GorillaFileSystem, MathAPI, …).

Sandboxing: the classes are the package's own code, but their arguments come from the model,
and some methods can be driven to exhaust time or memory (`MathAPI.power` with a huge integer
exponent, `square_root` / `logarithm` with a huge `precision`). So they run in the sandbox
worker like ToolHop and FTRL code: each episode opens a `BfclSession`, which instantiates the
entry's classes from its `initial_config` in a fresh, stateful sandbox namespace (calls are
replayed after a worker restart) and drops it when the episode closes.

Mapping to `Task`: the question is the first user turn; later turns, `missed_function`,
`excluded_function` and the per-turn ground truth are in `metadata` for a multi-turn runner.
The tools are the function docs of the involved classes (types mapped to JSON Schema: dict →
object, float → number, tuple → array, any → untyped) minus the excluded functions; on a name
clash the later class wins, as in BFCL's executor. `gt_calls` has one call per step, since the
calls of a turn are sequential.
"""

from __future__ import annotations

import itertools
import json
import os
from importlib import util
from typing import Any, Mapping, Optional, Sequence

from tirjax.env.datasets.pycalls import function_params, parse_call
from tirjax.env.sandbox import Sandbox
from tirjax.env.tools import Task, Tool, ToolError

MULTI_TURN_CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param",
                         "multi_turn_long_context")
_TYPES = {"dict": "object", "float": "number", "tuple": "array"}
_SETUP = """
import copy, importlib
for _name in classes:
    _obj = getattr(importlib.import_module(modules[_name]), _name)()
    if _name not in stateless:
        _obj._load_scenario(copy.deepcopy(config.get(_name, {})), long_context=long_context)
    globals()[_name] = _obj
"""
_session_ids = itertools.count()


def package_dir() -> str:
  spec = util.find_spec("bfcl_eval")
  if spec is None or not spec.submodule_search_locations:
    raise ImportError("bfcl_eval is not installed: pip install --no-deps bfcl-eval==2026.3.23 "
                      "mpmath")
  return list(spec.submodule_search_locations)[0]


def to_json_schema(schema: Any) -> Any:
  """A BFCL parameter schema in JSON Schema terms."""
  if not isinstance(schema, Mapping):
    return schema
  out = {}
  for key, value in schema.items():
    if key == "type":
      if value != "any":
        out["type"] = _TYPES.get(value, value)
    elif key == "properties" and isinstance(value, Mapping):
      out[key] = {name: to_json_schema(sub) for name, sub in value.items()}
    elif key in ("items", "additionalProperties") and isinstance(value, Mapping):
      out[key] = to_json_schema(value)
    else:
      out[key] = value
  return out


def _read_jsonl(path: str) -> list[dict]:
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


class _Backend:
  """Function docs, owners and method signatures of the BFCL classes (read, not imported)."""

  def __init__(self, data_dir: str):
    from bfcl_eval.constants import executable_backend_config as cfg
    self.modules = dict(cfg.CLASS_FILE_PATH_MAPPING)
    self.stateless = list(cfg.STATELESS_CLASSES)
    self.docs = {}
    for cls, fname in cfg.MULTI_TURN_FUNC_DOC_FILE_MAPPING.items():
      path = os.path.join(data_dir, "multi_turn_func_doc", fname)
      if os.path.exists(path):
        self.docs[cls] = _read_jsonl(path)
    self._params: dict[str, dict] = {}

  def params(self, cls: str) -> dict:
    if cls not in self._params:
      rel = self.modules[cls].split(".")[1:]
      path = os.path.join(package_dir(), *rel) + ".py"
      with open(path, encoding="utf-8") as f:
        self._params[cls] = function_params(f.read(), cls)
    return self._params[cls]


class BfclSession:
  """One episode's instances of an entry's classes, in a stateful sandbox namespace."""

  def __init__(self, sandbox: Sandbox, spec: Mapping[str, Any]):
    self.sandbox = sandbox
    self.owner = spec["owner"]
    self.ns = f"bfcl/{spec['id']}/{next(_session_ids)}"
    self.error = None
    try:
      sandbox.define(self.ns, _SETUP, {k: spec[k] for k in (
          "classes", "modules", "stateless", "config", "long_context")}, stateful=True)
    except ToolError as e:
      self.error = str(e)

  def call(self, name: str, arguments: Mapping[str, Any]) -> Any:
    if self.error is not None:
      raise ToolError(f"the BFCL back-end failed to start: {self.error}")
    if name not in self.owner:
      raise ToolError(f"unknown function {name!r}")
    return self.sandbox.call(self.ns, f"{self.owner[name]}.{name}", arguments)

  def close(self) -> None:
    self.sandbox.drop(self.ns)


def _make_session(sandbox: Sandbox, spec: Mapping[str, Any]):
  return lambda: BfclSession(sandbox, spec)


def bfcl_task(entry: dict, ground_truth: Sequence[Sequence[str]], category: str,
              sandbox: Sandbox, backend: _Backend) -> Task:
  classes = list(entry["involved_classes"])
  excluded = set(entry.get("excluded_function") or ())
  owner, docs = {}, {}
  for cls in classes:
    for doc in backend.docs.get(cls, ()):
      owner[doc["name"]] = cls
      docs[doc["name"]] = doc
  tools = [Tool(name=n, description=d.get("description", ""),
                parameters=to_json_schema(d["parameters"]))
           for n, d in docs.items() if n not in excluded]
  params = {n: backend.params(owner[n]).get(n, []) for n in owner}
  gt_turns = [[parse_call(text, params) for text in turn] for turn in ground_truth]
  spec = {"id": entry["id"], "classes": classes, "modules": backend.modules,
          "stateless": backend.stateless, "config": entry.get("initial_config") or {},
          "long_context": "long_context" in category, "owner": owner}
  first = entry["question"][0] if entry["question"] else []
  return Task(
      task_id=entry["id"], question="\n".join(m["content"] for m in first), tools=tools,
      answer=None, gt_calls=[[c] for turn in gt_turns for c in turn],
      metadata={"dataset": "bfcl", "category": category, "turns": entry["question"],
                "gt_turns": gt_turns, "missed_function": entry.get("missed_function") or {},
                "excluded_function": sorted(excluded), "involved_classes": classes,
                "initial_config": spec["config"]},
      session=_make_session(sandbox, spec))


def load_bfcl(sandbox: Sandbox, data_dir: Optional[str] = None,
              categories: Sequence[str] = MULTI_TURN_CATEGORIES,
              limit: Optional[int] = None) -> list[Task]:
  """Tasks of BFCL multi-turn categories from `data_dir` (default: the installed package's)."""
  data_dir = data_dir or os.path.join(package_dir(), "data")
  backend = _Backend(data_dir)
  tasks = []
  for category in categories:
    entries = _read_jsonl(os.path.join(data_dir, f"BFCL_v4_{category}.json"))
    answers = {a["id"]: a["ground_truth"] for a in _read_jsonl(
        os.path.join(data_dir, "possible_answer", f"BFCL_v4_{category}.json"))}
    for entry in entries[:limit]:
      tasks.append(bfcl_task(entry, answers[entry["id"]], category, sandbox, backend))
  return tasks
