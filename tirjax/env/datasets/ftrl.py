"""The FTRL test split (Ye et al. 2025): generated tools with verifiable expected outputs.

Parquet columns: `messages` [{role, content}], `tools` (JSON: OpenAI-style tool list),
`codes` (JSON: {tool name: Python source}), `unsolved_set` (JSON: {tool name: [expected
output substrings]}), `answer`, `data_source`, `split`. Each tool's source is defined in its
own sandbox namespace when the row loads (FTRL executes each tool's code separately, too).
`Task.expected` is the `unsolved_set`, from which the executor derives per-call solves.
"""

from __future__ import annotations

import json
from typing import Collection, Optional

from tirjax.env.registry import Environment, register
from tirjax.env.sandbox import Sandbox, SandboxTool
from tirjax.env.tools import Task, Tool, ToolError


def ftrl_task_id(row: dict, index: int) -> str:
  """The id of row `index` of the table: `<data_source>/<split>/<index>`."""
  return f"{row.get('data_source') or 'ftrl'}/{row.get('split', 'test')}/{index}"


def ftrl_task(row: dict, index: int, sandbox: Optional[Sandbox]) -> Task:
  """One FTRL row as a `Task`; its tool code is defined in `sandbox` now (None: not at all,
  the tasks' text, schemas and ground truth only, for sizing shapes: its tools cannot run)."""
  source = str(row.get("data_source") or "ftrl")
  task_id = ftrl_task_id(row, index)
  specs = json.loads(row["tools"])
  codes = json.loads(row["codes"])
  expected = {k: [str(x) for x in v] for k, v in json.loads(row["unsolved_set"]).items()}
  tools, stdout, errors = [], {}, {}
  for spec in specs:
    fn_spec = spec.get("function", spec)
    name = fn_spec["name"]
    fn = None
    if name not in codes:
      errors[name] = "no code for this tool"
    elif sandbox is not None:
      ns = f"ftrl/{task_id}/{name}"
      try:
        stdout[name] = sandbox.define(ns, codes[name])
      except ToolError as e:
        errors[name] = str(e)
      fn = SandboxTool(sandbox, ns, name)
    tools.append(Tool(name=name, description=fn_spec.get("description", ""),
                      parameters=fn_spec.get("parameters") or {"type": "object"}, fn=fn))
  messages = [dict(m) for m in row["messages"]]
  question = next(m["content"] for m in messages if m["role"] == "user")
  return Task(
      task_id=task_id, question=question, tools=tools,
      answer=None if row.get("answer") is None else str(row["answer"]), expected=expected,
      metadata={"dataset": "ftrl", "data_source": source, "messages": messages,
                "solve_rate": row.get("solve_rate"), "definition_stdout": stdout,
                "load_errors": errors})


def load_ftrl(path: str, sandbox: Optional[Sandbox], limit: Optional[int] = None,
              only: Optional[Collection[str]] = None) -> list[Task]:
  """Tasks of an FTRL parquet file (the first `limit` rows if given; those whose id is in
  `only`, if given); without a `sandbox`, tasks whose tools cannot run (`ftrl_task`)."""
  import pyarrow.parquet as pq  # only this loader needs it
  rows = pq.read_table(path).to_pylist()
  if limit is not None:
    rows = rows[:limit]
  return [ftrl_task(row, i, sandbox) for i, row in enumerate(rows)
          if only is None or ftrl_task_id(row, i) in only]


ENVIRONMENT = register(Environment(
    "ftrl", load=lambda path, sandbox, only: load_ftrl(path, sandbox, only=only),
    data_path="../shared/data/ftrl/ftrl_test.parquet", needs_data_file=True))
