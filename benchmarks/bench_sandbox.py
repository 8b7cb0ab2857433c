"""What a sandbox worker per namespace costs: start-up, a call's round trip, a namespace that
has to start again, loading ToolHop, a BFCL episode's back-end and verdict, and the tool calls
of one RL step on ToolHop.

    python -m benchmarks.bench_sandbox --json=benchmarks/results/bench_sandbox.json

The same script measures an earlier design when run against that tree, merged into the same
file under another label: the one-worker design (commit e4ecef7), or the worker model before
issue 40 (fea0cdb: workers as root of their user namespace, blocking pipes, one BFCL checker
namespace for every verdict):

    git archive fea0cdb | tar -x -C /tmp/fea0cdb
    PYTHONPATH=/tmp/fea0cdb python benchmarks/bench_sandbox.py --label=before_issue40_fea0cdb \\
        --json=benchmarks/results/bench_sandbox.json

The RL step replays the tool calls of `--queries` random ToolHop tasks with `--episodes`
episodes each, every episode calling each of its task's tools once (with no arguments: a
TypeError in the tool, still one full round trip to its worker), after the whole dataset was
loaded as the trainer loads it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import statistics
import sys
import time

from absl import app, flags

flags.DEFINE_string("json", "benchmarks/results/bench_sandbox.json", "Results (merged).")
flags.DEFINE_string("label", "worker_per_namespace", "Key of this run in the results file.")
flags.DEFINE_string("toolhop", "../shared/data/toolhop/toolhop100.jsonl", "ToolHop rows.")
flags.DEFINE_integer("repeats", 60, "Samples per start-up measurement.")
flags.DEFINE_integer("calls", 1000, "Samples of the call round trip.")
flags.DEFINE_integer("queries", 8, "ToolHop tasks per RL step (train.queries_per_step).")
flags.DEFINE_integer("episodes", 16, "Episodes per task (HiDiffTIR's group size).")
flags.DEFINE_integer("steps", 5, "RL steps replayed.")
flags.DEFINE_integer("bfcl_sessions", 20, "BFCL episodes' back-ends started.")
FLAGS = flags.FLAGS

TOOL = "def f(x):\n    return x\n"


def _stats(samples: list[float]) -> dict:
  ordered = sorted(samples)
  return {"median_ms": 1e3 * statistics.median(ordered),
          "p90_ms": 1e3 * ordered[int(0.9 * (len(ordered) - 1))], "n": len(ordered)}


def _timed(fn) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def _limits(**kw):
  from tirjax.env.sandbox import SandboxLimits
  fields = SandboxLimits.__dataclass_fields__
  return SandboxLimits(**{k: v for k, v in kw.items() if k in fields})


def measure_workers() -> dict:
  from tirjax.env.sandbox import Sandbox
  out = {}
  start = time.perf_counter()
  sb = Sandbox(_limits(max_workers=FLAGS.repeats + 1))
  sb.define("first", TOOL)
  out["sandbox_start_ms"] = 1e3 * (time.perf_counter() - start)
  out["define"] = _stats([_timed(lambda i=i: sb.define(f"n{i}", TOOL))
                          for i in range(FLAGS.repeats)])
  out["call"] = _stats([_timed(lambda i=i: sb.call("first", "f", {"x": i}))
                        for i in range(FLAGS.calls)])
  out["enforced"] = dict(sb.enforced)
  sb.close()
  # A namespace whose worker was closed (one live worker, two namespaces in turn): it starts
  # again and runs its code before the call. In the one-worker design nothing is closed.
  with Sandbox(_limits(max_workers=1)) as sb:
    sb.define("a", TOOL)
    sb.define("b", TOOL)
    out["call_after_close"] = _stats([_timed(lambda i=i: sb.call("ab"[i % 2], "f", {"x": i}))
                                      for i in range(FLAGS.repeats)])
  return out


def measure_toolhop() -> dict:
  from tirjax.env.datasets.toolhop import load_toolhop
  from tirjax.env.sandbox import Sandbox
  from tirjax.env.tools import ToolError
  out = {}
  with Sandbox() as sb:
    start = time.perf_counter()
    tasks = load_toolhop(FLAGS.toolhop, sb)
    out["load_s"] = time.perf_counter() - start
    out["namespaces"] = sum(len(t.tools) for t in tasks)
    rng = random.Random(0)
    steps, calls = [], 0
    for _ in range(FLAGS.steps):
      chosen = rng.sample(tasks, FLAGS.queries)
      start = time.perf_counter()
      for task in chosen:
        for _ in range(FLAGS.episodes):
          for tool in task.tools:
            if tool.fn is not None:
              try:
                tool.fn()
              except ToolError:
                pass
              calls += 1
      steps.append(time.perf_counter() - start)
    out["step"] = {"queries": FLAGS.queries, "episodes_per_query": FLAGS.episodes,
                   "calls_per_step": calls / FLAGS.steps, **_stats(steps)}
    out["restarts"] = sb.restarts
  return out


def measure_bfcl() -> dict:
  if importlib.util.find_spec("bfcl_eval") is None:
    return {"skipped": "bfcl_eval is not installed"}
  from tirjax.env.datasets.bfcl import checker_verdict, load_bfcl
  from tirjax.env.sandbox import Sandbox
  with Sandbox() as sb:
    tasks = load_bfcl(sb, categories=("multi_turn_base",), limit=FLAGS.bfcl_sessions)
    start = time.perf_counter()
    samples = []
    for task in tasks:
      samples.append(_timed(lambda t=task: t.session().close()))
    out = {"session": _stats(samples), "total_s": time.perf_counter() - start}
    verdicts = []  # bfcl-eval's checker on an episode without calls
    for task in tasks:
      gt, meta = task.metadata["ground_truth"], task.metadata
      entry = {"id": task.task_id, "initial_config": meta["initial_config"],
               "involved_classes": meta["involved_classes"]}
      verdicts.append(_timed(lambda gt=gt, entry=entry: checker_verdict(
          sb, [[] for _ in gt], gt, entry, meta["category"])))
    out["verdict"] = _stats(verdicts)
    return out


def main(_):
  from tirjax.reporting import benchmark
  info = benchmark.machine(jax_info=False)
  run = {"machine": info, "command": " ".join(sys.argv),
         "workers": measure_workers(), "bfcl": measure_bfcl()}
  if os.path.exists(FLAGS.toolhop):
    run["toolhop"] = measure_toolhop()
  run["machine"]["load_average_end"] = list(os.getloadavg())
  results = {}
  if os.path.exists(FLAGS.json):
    with open(FLAGS.json) as f:
      results = json.load(f)
  results.setdefault("runs", {})[FLAGS.label] = run
  benchmark.write_result(FLAGS.json, results)
  print(json.dumps(run, indent=2))


if __name__ == "__main__":
  app.run(main)
