"""Credit-assignment bench: every estimator trained on the chain task, over seeds.

    python -m experiments.credit_bench --json=benchmarks/results/credit_bench.json --seeds=0-9
    python -m experiments.credit_bench --estimators=grpo,portool/omega1=0,rloo --seeds=0,1
    python -m experiments.credit_bench --json=new.json --seeds=0-9 --reuse=old.json,more.json
    python -m experiments.report benchmarks/results/credit_bench.json --out=report/credit

Runs each cell (`tirjax.credit.cells`: an estimator label such as "portool/omega1=0"; by
default every registered estimator plus PORTool's ablations) for each seed on the task of
`tirjax.credit.task` (defaults), and reports per cell: episodes (training rows) until the
sampled policy's exact success reaches 90% of the optimum, final success and return, and the
unlearning rates (SPEC §4.1) averaged over training batches. Writes the JSON (command,
machine, options, every run with its curve) and a Markdown table next to it (`--markdown`),
and prints the table. A run that raises is recorded as failed and shown as such.

`--reuse=<earlier results>` keeps those files' finished runs whose cell (estimator, options,
rollouts, loss), seed, task and training options are the same as this command's, instead of
running them again; the first file that has a run wins. A run is deterministic given these and
the code, so this joins the pieces of one table run by the same code (seeds 0-4 and 5-9, say); a
file from older code is no substitute (the unlearning rate's definition changed in 270ba0d, for
one). Kept runs carry `"reused": true` and the file they come from; the header says how many
come from which file, run by what command on which machine. A record without a loss option
added since (e.g. `surrogate`) counts as that option's default.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import traceback

from absl import app, flags

from tirjax import cli, reporting
from tirjax.credit.cells import split_labels
from tirjax.reporting import benchmark
from tirjax.credit import cells, evaluate
from tirjax.credit.chain_rollouts import ChainRolloutOptions
from tirjax.credit.task import ChainTask
from tirjax.credit.train import CreditTrainOptions, run_cell
from tirjax.loss import LossOptions


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


_JSON = flags.DEFINE_string("json", None, "write the results here")
_MARKDOWN = flags.DEFINE_string("markdown", None, "write the table here (default: the JSON's .md)")
_SEEDS = flags.DEFINE_string("seeds", "0-4", "e.g. 0-4 or 0,2,5")
_ESTIMATORS = flags.DEFINE_string("estimators", None, "cell labels, comma-separated (default: "
                                  "every registered estimator and PORTool's ablations)")
_ITERATIONS = flags.DEFINE_integer("iterations", CreditTrainOptions.iterations,
                                   "training batches per run", lower_bound=1)
_REUSE = flags.DEFINE_list("reuse", [], "earlier result files whose finished runs of the same "
                           "cells, seeds, task and training are kept, not rerun")
_EARLY_ANSWER = flags.DEFINE_float("early_answer", ChainTask.early_answer,
                                   "R_out of an answer before the chain is done (0: "
                                   "unable_to_answer, a local optimum above a crash's -1; -1 "
                                   "removes it)")


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  try:
    seeds = parse_seeds(_SEEDS.value)
    labels = split_labels(_ESTIMATORS.value) if _ESTIMATORS.value else cells.default_labels()
    task, rollouts = ChainTask(early_answer=_EARLY_ANSWER.value), ChainRolloutOptions()
    train = CreditTrainOptions(iterations=_ITERATIONS.value)
    for label in labels:  # fail on a bad label before any run
      cells.parse_cell(label, rollouts, task.max_steps)
  except (ValueError, KeyError) as e:
    raise app.UsageError(str(e)) from e

  earlier, reuse = {}, {}
  for path in _REUSE.value:
    with open(path) as f:
      earlier[path] = json.load(f)
    for key, run in reusable_runs(earlier[path], task, train).items():
      reuse.setdefault(key, (run, path))
  start = time.perf_counter()
  runs = run_all(labels, seeds, task, train, rollouts, reuse=reuse)
  result = {"bench": "credit_bench",
            "command": "python -m experiments.credit_bench " + " ".join(_given_flags()),
            "machine": benchmark.machine(), "task": dataclasses.asdict(task),
            "train": dataclasses.asdict(train), "rollouts": dataclasses.asdict(rollouts),
            "optimal": evaluate.optimal_value(task),
            "seconds": round(time.perf_counter() - start, 1), "runs": runs}
  if earlier:
    result["reused"] = [
        {"from": path, "runs": sum(run.get("reused_from") == path for run in runs),
         "command": old.get("command"), "machine": old.get("machine"),
         "seconds": old.get("seconds")} for path, old in earlier.items()]
  markdown = header(result) + reporting.render_markdown(
      reporting.bench_study(result, _JSON.value or ""))
  if _JSON.value:
    os.makedirs(os.path.dirname(_JSON.value) or ".", exist_ok=True)
    with open(_JSON.value, "w") as f:
      f.write(dumps(result))
  if _MARKDOWN.value or _JSON.value:
    write_markdown(_MARKDOWN.value or os.path.splitext(_JSON.value)[0] + ".md", markdown)
  print(markdown)


def _given_flags() -> list[str]:
  """This command's flags that were given, as `--name=value`."""
  holders = (_JSON, _MARKDOWN, _SEEDS, _ESTIMATORS, _ITERATIONS, _EARLY_ANSWER, _REUSE)
  return [f"--{h.name}={','.join(h.value) if isinstance(h.value, list) else h.value}"
          for h in holders if h.present]


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


if __name__ == "__main__":
  cli.run(main)
