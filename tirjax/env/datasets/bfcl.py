"""BFCL multi-turn (Berkeley Function Calling Leaderboard v4) on its executable back-ends.

Data and back-ends come from the `bfcl-eval` package (installed with `--no-deps`): entries
`data/BFCL_v4_<category>.json` (JSON lines), ground truth `data/possible_answer/…` as Python
call strings per user turn (read with `ast`, never `eval`), function docs
`data/multi_turn_func_doc/*.json`, and the stateful classes (GorillaFileSystem, MathAPI, …).

Sandboxing: the classes are the package's own code, but their arguments come from the model,
and some methods can be driven to exhaust time or memory (`MathAPI.power` with a huge integer
exponent, `square_root` / `logarithm` with a huge `precision`). So they run in the sandbox
worker like ToolHop and FTRL code: each episode opens a `BfclSession`, which instantiates the
entry's classes from its `initial_config` in a fresh, stateful sandbox namespace (a worker
process of its own; calls are replayed after a worker restart) and drops it when the episode
closes. The classes' modules are imported once, by the sandbox's zygote (`Sandbox.preload`).

Mapping to `Task` (spec §6.1: the episode as bfcl-eval's multi-turn inference loop runs it):
the question is the first user turn and the later ones are a `Dialogue`, in order. A
`missed_function` is held back: it is not among the tools until the turn that the entry names,
and that turn's (empty) user message becomes bfcl-eval's prompting-mode message listing the
added function docs. `excluded_function` is kept in `metadata` only: bfcl-eval 2026.3.23 offers
every function of the involved classes (its code never reads the field), and so does this
loader. The tools' schemas map BFCL's types to JSON Schema (dict → object, float → number,
tuple → array, any → untyped); on a name clash the later class wins, as in BFCL's executor.
`gt_calls` has one call per step (the calls of a turn are sequential), and
`Dialogue.gt_call_turns` gives each call's turn, so that matching estimators match a turn's
calls against that turn's ground truth only. Success is bfcl-eval's own
`multi_turn_checker` (state and response checks per turn), called as a library inside the
sandbox on the episode's decoded calls (bfcl-eval's `convert_to_function_call` of each step's
calls); turns without ground truth expect no call, as that checker has it.

Verdicts no episode can touch (spec §6): the checker `eval`s call strings built of the model's
names, so a call whose name or argument names are not identifiers is malformed before any
string is built (`parser.py`, and `decode_calls` again); a call of a name that is not one of
the entry's functions reaches the checker as a call of an undefined name (`only_methods`);
and each verdict comes from a fresh sandbox worker that no earlier episode's calls reached.
The model's text is seen by the owner (parsing), the episode's back-end worker (calls as
keyword arguments, never evaluated) and that verdict's checker worker; none of it reaches the
owner's interpreter as code.
"""

from __future__ import annotations

import itertools
import json
import os
from importlib import util
from typing import Any, Collection, Mapping, Optional, Sequence

import numpy as np

from tirjax.config import Preset, Ref
from tirjax.env.datasets.pycalls import function_params, parse_call
from tirjax.env.registry import Environment, register
from tirjax.env.sandbox import Sandbox
from tirjax.env.tools import Dialogue, Task, Tool, ToolError, is_call_name

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
# bfcl-eval's checker, run in a sandbox worker of its own for each verdict: it `eval`s the
# episode's call strings in its module's globals, so a namespace an earlier episode's calls
# reached could return any verdict; a fresh worker starts from the zygote's pristine modules.
_CHECKER = """
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker as _checker

def check(decoded, ground_truth, entry, category):
    try:
        out = _checker.multi_turn_checker(decoded, ground_truth, entry, category, "tirjax")
        return {"valid": bool(out["valid"]), "error_type": out.get("error_type"),
                "error_message": str(out.get("error_message", ""))[:300]}
    except Exception as e:
        return {"valid": False, "error_type": "checker_raised",
                "error_message": ("%s: %s" % (type(e).__name__, e))[:300]}
"""
_CHECKER_MODULES = ("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker",
                    "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils")
MAX_STEPS_PER_TURN = 20  # bfcl-eval's MAXIMUM_STEP_LIMIT (constants.default_prompts)
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


def checker_verdict(sandbox: Sandbox, decoded: list, ground_truth: Sequence[Sequence[str]],
                    entry: Mapping[str, Any], category: str) -> dict:
  """bfcl-eval's `multi_turn_checker` on `decoded` (per turn, per step, the call strings):
  {"valid", "error_type", "error_message"}. Runs in a fresh sandbox worker, dropped after
  this verdict (the checker `eval`s the calls): no earlier verdict's calls reach it."""
  ns = f"bfcl/checker/{next(_checker_ids)}"
  task_entry = {k: entry[k] for k in ("id", "initial_config", "involved_classes")}
  try:
    sandbox.define(ns, _CHECKER)
    return sandbox.call(ns, "check", {
        "decoded": decoded, "ground_truth": [list(t) for t in ground_truth],
        "entry": task_entry, "category": category})
  except ToolError as e:
    return {"valid": False, "error_type": "sandbox", "error_message": str(e)[:300]}
  finally:
    sandbox.drop(ns)


_checker_ids = itertools.count()


def only_methods(decoded: list, methods) -> list:
  """`decoded` with each call of a name that is not one of `methods` (the entry's classes'
  functions) replaced by a call of an undefined name. bfcl-eval's checker evaluates a call
  of any other name in its own module's globals, where one of them (its
  `execute_multi_turn_func_call`) `eval`s strings given as arguments: an episode could run
  code in the checker and set its own verdict. bfcl-eval reports either call as an
  execution error, and such a result never matches the ground truth's (its calls are all
  methods), so the verdict is the same."""
  def guarded(call: str) -> str:
    name = call.split("(", 1)[0]
    return call if name in methods else f"{name}__is_not_a_function_of_this_entry()"
  return [[[guarded(c) for c in step] for step in turn] for turn in decoded]


def decode_calls(calls: Sequence[Mapping[str, Any]]) -> list[str]:
  """A step's calls as bfcl-eval's handlers decode them (`convert_to_function_call`). The
  names go into code that a checker evaluates: a name or argument name that is not an
  ASCII identifier is refused here too (the parser makes such a call malformed; spec §6;
  `tools.is_call_name`)."""
  from bfcl_eval.model_handler.utils import convert_to_function_call
  for c in calls:
    names = [c["name"], *c["arguments"]]
    if not all(is_call_name(n) for n in names):
      raise ValueError(f"call names must be ASCII identifiers: {str(names)[:80]}")
  return convert_to_function_call([{c["name"]: dict(c["arguments"])} for c in calls])


def _user_turns(entry: dict, held_back: Mapping[str, list]) -> list[str]:
  """The user messages of turns 1.., with bfcl-eval's substitution at a held-back turn."""
  from bfcl_eval.constants.default_prompts import (
      DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING as HELD_BACK_PROMPT)
  turns = []
  for i, messages in enumerate(entry["question"][1:], 1):
    if str(i) in held_back:
      turns.append(HELD_BACK_PROMPT.format(functions=held_back[str(i)]))
    else:
      turns.append("\n".join(m["content"] for m in messages))
  return turns


def _tool(doc: Mapping[str, Any]) -> Tool:
  return Tool(name=doc["name"], description=doc.get("description", ""),
              parameters=to_json_schema(doc["parameters"]))


def bfcl_task(entry: dict, ground_truth: Sequence[Sequence[str]], category: str,
              sandbox: Optional[Sandbox], backend: _Backend) -> Task:
  """One entry as a `Task` whose episodes run and are scored in `sandbox` (None: the task's
  text, schemas and ground truth only, for sizing shapes: it cannot run)."""
  classes = list(entry["involved_classes"])
  owner, docs = {}, {}
  for cls in classes:
    for doc in backend.docs.get(cls, ()):
      owner[doc["name"]] = cls
      docs[doc["name"]] = doc
  missed = entry.get("missed_function") or {}
  held_back = {turn: [docs[n] for n in names if n in docs] for turn, names in missed.items()}
  withheld = {d["name"] for turn_docs in held_back.values() for d in turn_docs}
  tools = [_tool(d) for n, d in docs.items() if n not in withheld]
  params = {n: backend.params(owner[n]).get(n, []) for n in owner}
  gt_turns = [[parse_call(text, params) for text in turn] for turn in ground_truth]
  spec = {"id": entry["id"], "classes": classes, "modules": backend.modules,
          "stateless": backend.stateless, "config": entry.get("initial_config") or {},
          "long_context": "long_context" in category, "owner": owner}
  checker_entry = {"id": entry["id"], "initial_config": spec["config"],
                   "involved_classes": classes}

  def score(decoded: list) -> bool:
    return checker_verdict(sandbox, only_methods(decoded, owner), ground_truth, checker_entry,
                           category)["valid"]

  dialogue = Dialogue(
      user_turns=_user_turns(entry, held_back), max_steps_per_turn=MAX_STEPS_PER_TURN,
      decode=decode_calls, score=score,
      gt_call_turns=[i for i, turn in enumerate(gt_turns) for _ in turn],
      turn_tools={int(turn): [_tool(d) for d in turn_docs]
                  for turn, turn_docs in held_back.items()})
  first = entry["question"][0] if entry["question"] else []
  return Task(
      task_id=entry["id"], question="\n".join(m["content"] for m in first), tools=tools,
      answer=None, gt_calls=[[c] for turn in gt_turns for c in turn],
      metadata={"dataset": "bfcl", "category": category, "turns": entry["question"],
                "gt_turns": gt_turns, "ground_truth": [list(t) for t in ground_truth],
                "missed_function": missed,
                "excluded_function": sorted(entry.get("excluded_function") or ()),
                "involved_classes": classes, "initial_config": spec["config"]},
      session=None if sandbox is None else _make_session(sandbox, spec), dialogue=dialogue)


def load_bfcl(sandbox: Optional[Sandbox], data_dir: Optional[str] = None,
              categories: Sequence[str] = MULTI_TURN_CATEGORIES,
              limit: Optional[int] = None, only: Optional[Collection[str]] = None) -> list[Task]:
  """Tasks of BFCL multi-turn categories from `data_dir` (default: the installed package's;
  the first `limit` entries of each category, if given; those whose id is in `only`, if
  given); without a `sandbox`, tasks that cannot run (`bfcl_task`)."""
  data_dir = data_dir or os.path.join(package_dir(), "data")
  backend = _Backend(data_dir)
  # Each episode's back-end is a fresh worker: it starts with the classes' modules (and the
  # checker's) already imported, by the sandbox's zygote. Those that fail to import (missing
  # optional dependencies) fail in the episodes that need them, as before.
  if sandbox is not None:
    sandbox.preload(sorted(set(backend.modules.values())) + list(_CHECKER_MODULES))
  tasks = []
  for category in categories:
    entries = _read_jsonl(os.path.join(data_dir, f"BFCL_v4_{category}.json"))
    answers = {a["id"]: a["ground_truth"] for a in _read_jsonl(
        os.path.join(data_dir, "possible_answer", f"BFCL_v4_{category}.json"))}
    for entry in entries[:limit]:
      if only is None or entry["id"] in only:
        tasks.append(bfcl_task(entry, answers[entry["id"]], category, sandbox, backend))
  return tasks


# `env.data_path` "": the installed bfcl-eval package's data folder.
def bfcl_accuracy(episodes, by_id, answer_in_tool_message: bool = False) -> dict[str, float]:
  """BFCL multi-turn accuracy as bfcl-eval reports it: `eval/bfcl/<category>`, the share of
  entries its checker accepts; `eval/bfcl/overall`, the unweighted mean over the categories
  evaluated (bfcl-eval's multi-turn summary). (`answer_in_tool_message` is ToolHop's.)"""
  del answer_in_tool_message
  by_category: dict[str, list] = {}
  for e in episodes:
    by_category.setdefault(by_id[e.task_id].metadata["category"], []).append(e.verdict == "true")
  out = {f"eval/bfcl/{c}": float(np.mean(v)) for c, v in sorted(by_category.items())}
  out["eval/bfcl/overall"] = float(np.mean([np.mean(v) for v in by_category.values()]))
  return out


PRESET = Preset("bfcl", doc="""\
BFCL multi-turn (spec §6.1): all of an entry's user turns in one episode. Its longest ground
truth takes 37 steps one call at a time (35 calls over up to 8 turns, plus each turn's closing
message), so T_max = 48; C = 40 ground-truth calls, P = 8 arguments (6 at most in the data);
L = 16,384 tokens (the system prompt's function docs alone take 4-7k tokens with the toolworld
tokenizer).""", values={
    "rollout.max_steps": 48, "rollout.shapes.max_steps": Ref("rollout.max_steps"),
    "rollout.shapes.max_gt_calls": 40, "rollout.shapes.max_params": 8,
    "rollout.shapes.max_tokens": 16384})

ENVIRONMENT = register(Environment(
    "bfcl", load=lambda path, sandbox, only: load_bfcl(sandbox, data_dir=path or None, only=only),
    episode_metrics=bfcl_accuracy, presets=(PRESET,)))
