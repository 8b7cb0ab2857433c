"""ToolHop (Ye et al., ACL 2025): multi-hop queries whose tools are generated Python functions.

Each JSON line holds `question`, `answer`, `sub_task`, `tools` {sub-question: JSON-schema
tool}, `functions` [Python source], and, for some rows, `gold_calls` [Python call strings].
Every function source is defined once in its own sandbox namespace when the row loads (the
sources run module-level example code that prints; that output is kept in
`metadata["definition_stdout"]`, failures in `metadata["load_errors"]`).

A few rows list two different tools under one name; the later ones are renamed `name_2`, … so
that names stay unique, each bound to its own source (matched by parameter names), and gold
calls are routed to the variant whose parameters fit their arguments.
"""

from __future__ import annotations

import json
from typing import Collection, Optional

from tirjax.env import metrics
from tirjax.env.datasets.pycalls import function_params, parse_call
from tirjax.env.registry import Environment, register
from tirjax.env.sandbox import Sandbox, SandboxTool
from tirjax.env.tools import Task, Tool, ToolError


def _pick_source(spec: dict, sources: list, used: set) -> Optional[int]:
  """The unused source defining spec's function whose parameters best match its schema."""
  props = set((spec.get("parameters") or {}).get("properties") or {})
  best, best_score = None, -1.0
  for i, (defs, _) in enumerate(sources):
    if i in used or spec["name"] not in defs:
      continue
    params = set(defs[spec["name"]])
    score = len(props & params) / max(1, len(props | params))
    if score > best_score:
      best, best_score = i, score
  return best


def _route(text: str, variants: list, taken: set) -> dict:
  """Parses a gold call, choosing the first fitting (preferably unused) same-named variant."""
  base = _base(text)
  fitting = []
  for tool_name, params in variants:
    try:
      call = parse_call(text, {base: params})
    except ValueError:
      continue
    if set(call["arguments"]) <= set(params):
      fitting.append((tool_name, call))
  if not fitting:  # no variant takes these arguments: keep the first, execution will tell
    call = parse_call(text, {base: variants[0][1]})
    return {"name": variants[0][0], "arguments": call["arguments"]}
  tool_name, call = next(((n, c) for n, c in fitting if n not in taken), fitting[0])
  taken.add(tool_name)
  return {"name": tool_name, "arguments": call["arguments"]}


def _base(text: str) -> str:
  return text.strip().split("(", 1)[0].strip()


def toolhop_task(row: dict, sandbox: Optional[Sandbox]) -> Task:
  """One ToolHop row as a `Task`; its tool code is defined in `sandbox` now (None: not at all,
  the tasks' text, schemas and ground truth only, for sizing shapes: its tools cannot run)."""
  task_id = str(row["id"])
  sources = []
  for src in row["functions"]:
    try:
      sources.append((function_params(src), src))
    except SyntaxError:
      sources.append(({}, src))
  tools, used, variants = [], set(), {}
  stdout, errors = {}, {}
  for spec in row["tools"].values():
    base = spec["name"]
    name = base if base not in variants else f"{base}_{len(variants[base]) + 1}"
    i = _pick_source(spec, sources, used)
    fn = None
    if i is None:
      errors[name] = f"no function source defines {base!r}"
    else:
      used.add(i)
    if i is not None and sandbox is not None:
      ns = f"toolhop/{task_id}/{name}"
      try:
        stdout[name] = sandbox.define(ns, sources[i][1])
      except ToolError as e:
        errors[name] = str(e)
      fn = SandboxTool(sandbox, ns, base)
    params = sources[i][0].get(base, []) if i is not None else []
    variants.setdefault(base, []).append((name, params))
    tools.append(Tool(name=name, description=spec.get("description", ""),
                      parameters=spec["parameters"], fn=fn))
  gt_calls, taken = [], set()
  try:
    for text in row.get("gold_calls") or ():
      base = _base(text)
      call = _route(text, variants[base], taken) if base in variants else parse_call(text)
      gt_calls.append([call])
  except ValueError as e:
    gt_calls, errors["gold_calls"] = [], str(e)
  return Task(
      task_id=task_id, question=row["question"], tools=tools, answer=str(row["answer"]),
      gt_calls=gt_calls,
      metadata={"dataset": "toolhop", "hop_count": row.get("hop_count"),
                "domain": row.get("domain"), "answer_type": row.get("answer_type"),
                "sub_task": row.get("sub_task"), "definition_stdout": stdout,
                "load_errors": errors})


def load_toolhop(path: str, sandbox: Optional[Sandbox], limit: Optional[int] = None,
                 only: Optional[Collection[str]] = None) -> list[Task]:
  """Tasks of a ToolHop JSON-lines file (the first `limit` rows if given; those whose id is in
  `only`, if given); without a `sandbox`, tasks whose tools cannot run (`toolhop_task`)."""
  tasks = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      if limit is not None and len(tasks) >= limit:
        break
      if line.strip():
        row = json.loads(line)
        if only is None or str(row["id"]) in only:
          tasks.append(toolhop_task(row, sandbox))
  return tasks


def episode_metrics(episodes, by_id, answer_in_tool_message: bool) -> dict[str, float]:
  """ToolHop's answer correctness `eval/answer_correctness` (the paper's containment, a mean
  per query); `answer_in_tool_message` also accepts an answer contained in the tool response
  before the answering step (FTRL's scorer's rule)."""
  return {"eval/answer_correctness": metrics.query_mean(
      [e.task_id for e in episodes],
      [metrics.answer_correctness(
          e.answer, by_id[e.task_id].answer,
          _preceding_tool_message(e) if answer_in_tool_message else None) for e in episodes])}


def _preceding_tool_message(episode) -> Optional[str]:
  """The tool response of the step before the answering one (None if the row answered first
  or did not answer)."""
  if episode.answer is None or len(episode.results) < 2:
    return None
  return episode.results[-2].response_content


ENVIRONMENT = register(Environment(
    "toolhop", load=lambda path, sandbox, only: load_toolhop(path, sandbox, only=only),
    data_path="../shared/data/toolhop/toolhop100.jsonl", needs_data_file=True,
    episode_metrics=episode_metrics, gold_answers=True))
