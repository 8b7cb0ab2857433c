"""The credit-assignment bench (`experiments.studies.credit_bench` is its command line; its
docstring says what a cell, a run and `--reuse` are): every cell trained on the chain task for
each seed, a crashed run recorded as failed, the result written as JSON (one line per run) and
a Markdown table whose hand-written notes survive a rewrite.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import traceback
from typing import Optional, Sequence

from tirjax import reporting
from tirjax.credit import cells, evaluate
from tirjax.credit.cells import split_labels
from tirjax.credit.chain_rollouts import ChainRolloutOptions
from tirjax.credit.task import ChainTask
from tirjax.credit.train import CreditTrainOptions, run_cell
from tirjax.loss import LossOptions
from tirjax.reporting import benchmark

__all__ = ["NOTES_MARKER", "checked", "parse_seeds", "run", "run_all", "split_labels",
           "write_markdown"]


def parse_seeds(text: str) -> list[int]:
  """"0-4" → [0, 1, 2, 3, 4]; "0,3,7" → [0, 3, 7]; items may mix both."""
  seeds = []
  for item in filter(None, (s.strip() for s in text.split(","))):
    lo, sep, hi = item.partition("-")
    try:
      seeds += list(range(int(lo), int(hi) + 1)) if sep else [int(item)]
    except ValueError:
      raise ValueError(f"--seeds: expected integers or ranges a-b, got '{item}'") from None
  if not seeds or len(set(seeds)) != len(seeds):
    raise ValueError(f"--seeds: need distinct seeds, got '{text}'")
  return seeds


def reusable_runs(result: dict, task: ChainTask, train: CreditTrainOptions) -> dict:
  """{(label, seed): run} of an earlier result's finished runs, if it ran this task with
  these training options (else none)."""
  if result.get("task") != _json(dataclasses.asdict(task)) or result.get("train") != _json(
      dataclasses.asdict(train)):
    return {}
  return {(run["label"], run["seed"]): run for run in result["runs"]
          if run["state"] == "finished"}


def _json(value):
  """`value` as it reads back from a result file (tuples become lists)."""
  return json.loads(json.dumps(value))


def _same_cell(old: dict, entry: dict) -> bool:
  """An earlier run's cell is this one's: same estimator, options, rollouts and loss."""
  loss = {**dataclasses.asdict(LossOptions()), **old["loss"]}  # options added since: default
  entry = _json(entry)
  return all(old[k] == entry[k] for k in ("estimator", "options", "rollouts")) and (
      _json(loss) == entry["loss"])


def run_all(labels: list[str], seeds: list[int], task: ChainTask, train: CreditTrainOptions,
            rollouts: ChainRolloutOptions, log=sys.stderr, reuse: dict | None = None
            ) -> list[dict]:
  """Every (label, seed) run, or kept from `reuse`: {(label, seed): (earlier run, its file)}."""
  runs = []
  for label in labels:
    cell = cells.parse_cell(label, rollouts, task.max_steps)
    for seed in seeds:
      entry = {"label": label, "estimator": cell.estimator, "options": dict(cell.options),
               "rollouts": dataclasses.asdict(cell.rollouts), "loss": dataclasses.asdict(cell.loss),
               "seed": seed}
      old, source = (reuse or {}).get((label, seed), (None, None))
      if old is not None and _same_cell(old, entry):
        runs.append({**old, **entry, "reused": True, "reused_from": source})
        continue
      try:
        out = run_cell(task, cell, seed, train)
        entry.update(state="finished", error=None, final=out["final"], curve=out["curve"],
                     seconds=round(out["seconds"], 3))
      except Exception as e:  # a crashed cell is a result: record it, keep going
        entry.update(state="failed", error=f"{type(e).__name__}: {e}", final={}, curve={},
                     traceback=traceback.format_exc())
      runs.append(entry)
      final = entry["final"]
      print(f"{label:34s} seed {seed}: {entry['state']}"
            + (f"  success {final['eval/success']:.3f}  episodes→90% "
               f"{final['episodes_to_threshold']}  {entry['seconds']:.1f}s"
               if final else f"  {entry['error']}"), file=log, flush=True)
  return runs

def checked(seeds: str, estimators: Optional[str], iterations: int, early_answer: float
            ) -> tuple[list[int], list[str], ChainTask, ChainRolloutOptions, CreditTrainOptions]:
  """The seeds, cell labels (default: `cells.default_labels`), task, rollouts and training
  options, every label parsed before any run (a `ValueError` or `KeyError` names the bad one)."""
  seed_list = parse_seeds(seeds)
  labels = split_labels(estimators) if estimators else cells.default_labels()
  task, rollouts = ChainTask(early_answer=early_answer), ChainRolloutOptions()
  train = CreditTrainOptions(iterations=iterations)
  for label in labels:
    cells.parse_cell(label, rollouts, task.max_steps)
  return seed_list, labels, task, rollouts, train


def run(seeds: str = "0-4", estimators: Optional[str] = None,
        iterations: int = CreditTrainOptions.iterations,
        early_answer: float = ChainTask.early_answer, reuse: Sequence[str] = (),
        json_path: Optional[str] = None, markdown_path: Optional[str] = None,
        command: str = "") -> tuple[dict, str]:
  """Runs the bench (keeping `reuse` files' matching runs); writes the JSON to `json_path` and
  the table to `markdown_path` (default: the JSON's .md) when given; returns (result, table)."""
  seed_list, labels, task, rollouts, train = checked(seeds, estimators, iterations,
                                                     early_answer)
  earlier, kept = {}, {}
  for path in reuse:
    with open(path) as f:
      earlier[path] = json.load(f)
    for key, old in reusable_runs(earlier[path], task, train).items():
      kept.setdefault(key, (old, path))
  start = time.perf_counter()
  runs = run_all(labels, seed_list, task, train, rollouts, reuse=kept)
  result = {"bench": "credit_bench", "command": command,
            "machine": benchmark.machine(), "task": dataclasses.asdict(task),
            "train": dataclasses.asdict(train), "rollouts": dataclasses.asdict(rollouts),
            "optimal": evaluate.optimal_value(task),
            "seconds": round(time.perf_counter() - start, 1), "runs": runs}
  if earlier:
    result["reused"] = [
        {"from": path, "runs": sum(r.get("reused_from") == path for r in runs),
         "command": old.get("command"), "machine": old.get("machine"),
         "seconds": old.get("seconds")} for path, old in earlier.items()]
  table = header(result) + reporting.render_markdown(
      reporting.bench_study(result, json_path or ""))
  if json_path:
    os.makedirs(os.path.dirname(json_path) or ".", exist_ok=True)
    with open(json_path, "w") as f:
      f.write(dumps(result))
  if markdown_path or json_path:
    write_markdown(markdown_path or os.path.splitext(json_path)[0] + ".md", table)
  return result, table


NOTES_MARKER = benchmark.NOTES_MARKER
write_markdown = benchmark.write_markdown


def dumps(result: dict) -> str:
  """The result as JSON with one line per run (diff-friendly, a few hundred kB)."""
  head = json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1)
  runs = ",\n".join("  " + json.dumps(r) for r in result["runs"])
  return head[:-2] + ',\n "runs": [\n' + runs + "\n ]\n}\n"


def header(result: dict) -> str:
  m = result["machine"]
  reused = "".join(
      f"\n- {r['runs']} of the {len(result['runs'])} runs from `{r['from']}`: `{r['command']}` "
      f"({_machine(r['machine'])}, {r['seconds']} s)" for r in result.get("reused", []))
  if reused:
    reused = ("\n\nKept from earlier results (`--reuse`: same cell, seed, task and training; the "
              "seconds above count the others):" + reused)
  return (f"# Credit bench\n\nCommand: `{result['command']}`\n\n"
          f"Machine: {_machine(m)}; {result['seconds']} s in all.{reused}\n\n"
          f"Task: {json.dumps(result['task'])}\n\nTraining: {json.dumps(result['train'])}\n\n"
          f"Rollouts: {json.dumps(result['rollouts'])}\n\n")


def _machine(m: dict) -> str:
  """A result's machine in words (files written before `cpu` was recorded lack it)."""
  return (f"{m.get('cpu', m['platform'])}, {m['platform']}, {m['cpus']} CPUs, Python "
          f"{m['python']}, jax {m['jax']} ({m['backend']})")
