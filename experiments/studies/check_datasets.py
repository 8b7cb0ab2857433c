"""Offline check of the real-data loaders: how many items load and how many executions succeed.

    python -m experiments.studies.check_datasets --toolhop=../shared/data/toolhop/toolhop100.jsonl \
        --ftrl=../shared/data/ftrl/ftrl_test.parquet --bfcl --json=benchmarks/results/datasets.json

ToolHop: replays the gold calls (rows that have them) through `ToolEnv` and checks that the
last output contains the gold answer. FTRL: calls every tool once with arguments synthesised
from its schema (required parameters only). BFCL: replays every multi-turn ground truth.
Prints one JSON object of counts (and writes it with --json).
"""

from __future__ import annotations

import json
import time

from absl import app, flags

from tirjax import cli
from tirjax.env import verify
from tirjax.env.datasets.bfcl import load_bfcl
from tirjax.env.datasets.ftrl import load_ftrl
from tirjax.env.datasets.toolhop import load_toolhop
from tirjax.env.executor import ToolEnvOptions, ToolEnv
from tirjax.env.sandbox import Sandbox
from tirjax.env.tools import ToolError
from tirjax.reporting import benchmark


def _step(calls) -> str:
  return f"<think></think><tool_call>{json.dumps(calls, ensure_ascii=False)}</tool_call>"


def replay(task) -> tuple[int, int, list]:
  """(calls, calls passing all five checks, per-call results) of the task's ground truth."""
  calls = task.flat_gt_calls
  passed, results = 0, []
  with ToolEnv(task, ToolEnvOptions(max_steps=len(calls) + 1)) as env:
    for call in calls:
      r = env.step(_step([call]))
      passed += r.checks_passed == 5
      results.append(r.call_results[0])
  return len(calls), passed, results


def synth(schema: dict):
  """A plausible value for a schema: enum's first, else a fixed value of its type."""
  if "enum" in schema and schema["enum"]:
    return schema["enum"][0]
  if "default" in schema:
    return schema["default"]
  t = schema.get("type")
  t = t[0] if isinstance(t, list) else t
  return {"string": "test", "integer": 1, "number": 1.0, "boolean": True, "array": [],
          "object": {}}.get(t, "test")


def check_toolhop(path: str, sandbox: Sandbox) -> dict:
  tasks = load_toolhop(path, sandbox)
  out = {"rows": len(tasks), "tools": sum(len(t.tools) for t in tasks),
         "definitions_failed": sum(len(t.metadata["load_errors"]) for t in tasks),
         "rows_with_gold_calls": 0, "gold_calls": 0, "gold_calls_ok": 0,
         "rows_all_gold_ok": 0, "rows_final_output_has_answer": 0}
  for task in tasks:
    if not task.gt_calls:
      continue
    n, ok, results = replay(task)
    out["rows_with_gold_calls"] += 1
    out["gold_calls"] += n
    out["gold_calls_ok"] += ok
    out["rows_all_gold_ok"] += ok == n
    last = results[-1]
    out["rows_final_output_has_answer"] += ("result" in last and
                                            verify.contains_answer(last["result"], task.answer))
  return out


def check_ftrl(path: str, sandbox: Sandbox) -> dict:
  tasks = load_ftrl(path, sandbox)
  out = {"rows": len(tasks), "tools": sum(len(t.tools) for t in tasks),
         "definitions_failed": sum(len(t.metadata["load_errors"]) for t in tasks),
         "tool_calls": 0, "executed": 0, "returned_error_object": 0,
         "expected_answers": sum(len(v) for t in tasks for v in t.expected.values())}
  for task in tasks:
    for tool in task.tools:
      params = tool.parameters
      args = {k: synth(params.get("properties", {}).get(k, {}))
              for k in params.get("required", [])}
      out["tool_calls"] += 1
      try:
        value = tool.fn(**args)
      except ToolError:
        continue
      out["executed"] += 1
      out["returned_error_object"] += isinstance(value, dict) and bool(value.get("error"))
  return out


def check_bfcl(sandbox: Sandbox) -> dict:
  tasks = load_bfcl(sandbox)
  out = {"entries": len(tasks), "gt_calls": 0, "gt_calls_ok": 0, "entries_all_ok": 0}
  for task in tasks:
    n, ok, _ = replay(task)
    out["gt_calls"] += n
    out["gt_calls_ok"] += ok
    out["entries_all_ok"] += ok == n
  return out


_TOOLHOP = flags.DEFINE_string("toolhop", None, "ToolHop's JSONL file")
_FTRL = flags.DEFINE_string("ftrl", None, "FTRL's parquet file")
_BFCL = flags.DEFINE_boolean("bfcl", False, "check BFCL multi-turn (bfcl-eval's own data)")
_JSON = flags.DEFINE_string("json", None, "also write the report here")


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  report = {}
  with Sandbox() as sandbox:
    report["sandbox"] = sandbox.enforced
    for name, fn in (("toolhop", lambda: _TOOLHOP.value and check_toolhop(_TOOLHOP.value, sandbox)),
                     ("ftrl", lambda: _FTRL.value and check_ftrl(_FTRL.value, sandbox)),
                     ("bfcl", lambda: _BFCL.value and check_bfcl(sandbox))):
      t0 = time.perf_counter()
      result = fn()
      if result:
        report[name] = dict(result, seconds=round(time.perf_counter() - t0, 2))
    report["sandbox_restarts"] = sandbox.restarts
  print(benchmark.write_result(_JSON.value, report))


if __name__ == "__main__":
  cli.run(main)
