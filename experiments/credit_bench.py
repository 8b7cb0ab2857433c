"""Credit-assignment bench: every estimator trained on the chain task, over seeds.

    python -m experiments.credit_bench --json=benchmarks/results/credit_bench.json --seeds=0-9
    python -m experiments.credit_bench --estimators=grpo,portool/omega1=0,rloo --seeds=0,1
    python -m experiments.report benchmarks/results/credit_bench.json --out=report/credit

Runs each cell (`tirjax.credit.cells`: an estimator label such as "portool/omega1=0"; by
default every registered estimator plus PORTool's ablations) for each seed on the task of
`tirjax.credit.task` (defaults), and reports per cell: episodes (training rows) until the
sampled policy's exact success reaches 90% of the optimum, final success and return, and the
unlearning rates (SPEC §4.1) averaged over training batches. Writes the JSON (command,
machine, options, every run with its curve) and a Markdown table next to it (`--markdown`),
and prints the table. A run that raises is recorded as failed and shown as such.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
import traceback

import jax

from tirjax import reporting
from tirjax.credit import cells, evaluate
from tirjax.credit.sampling import RolloutOptions
from tirjax.credit.task import ChainTask
from tirjax.credit.train import TrainOptions, run_cell


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


def split_labels(text: str) -> list[str]:
  """Comma-separated cell labels; an item with '=' but no '/' continues the previous label's
  options, so "grpo,portool/omega1=0,fork_scale=none" is two cells."""
  labels: list[str] = []
  for item in filter(None, (s.strip() for s in text.split(","))):
    if "=" in item and "/" not in item:
      if not labels:
        raise ValueError(f"--estimators: option '{item}' before any estimator name")
      labels[-1] += "," + item
    else:
      labels.append(item)
  return labels


def machine() -> dict:
  return {"platform": platform.platform(), "processor": platform.processor() or "unknown",
          "cpus": len(os.sched_getaffinity(0)), "python": platform.python_version(),
          "jax": jax.__version__, "backend": jax.default_backend(),
          "devices": [str(d) for d in jax.devices()]}


def run_all(labels: list[str], seeds: list[int], task: ChainTask, train: TrainOptions,
            rollouts: RolloutOptions, log=sys.stderr) -> list[dict]:
  runs = []
  for label in labels:
    cell = cells.parse_cell(label, rollouts, task.max_steps)
    for seed in seeds:
      entry = {"label": label, "estimator": cell.estimator, "options": dict(cell.options),
               "rollouts": dataclasses.asdict(cell.rollouts), "loss": dataclasses.asdict(cell.loss),
               "seed": seed}
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


def main(argv=None) -> None:
  argv = sys.argv[1:] if argv is None else argv
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--json", help="write the results here")
  parser.add_argument("--markdown", help="write the table here (default: the JSON's .md)")
  parser.add_argument("--seeds", default="0-4", help="e.g. 0-4 or 0,2,5")
  parser.add_argument("--estimators", default=None,
                      help="cell labels, comma-separated (default: every registered estimator "
                           "and PORTool's ablations)")
  parser.add_argument("--iterations", type=int, default=TrainOptions.iterations,
                      help="training batches per run")
  parser.add_argument("--early-answer", type=float, default=ChainTask.early_answer,
                      help="R_out of an answer before the chain is done (0: unable_to_answer, "
                           "a local optimum above a crash's -1; -1 removes it)")
  args = parser.parse_args(argv)
  try:
    seeds = parse_seeds(args.seeds)
    labels = split_labels(args.estimators) if args.estimators else cells.default_labels()
    task, rollouts = ChainTask(early_answer=args.early_answer), RolloutOptions()
    train = TrainOptions(iterations=args.iterations)
    for label in labels:  # fail on a bad label before any run
      cells.parse_cell(label, rollouts, task.max_steps)
  except (ValueError, KeyError) as e:
    parser.error(str(e))

  start = time.perf_counter()
  runs = run_all(labels, seeds, task, train, rollouts)
  result = {"bench": "credit_bench",
            "command": "python -m experiments.credit_bench " + " ".join(argv),
            "machine": machine(), "task": dataclasses.asdict(task),
            "train": dataclasses.asdict(train), "rollouts": dataclasses.asdict(rollouts),
            "optimal": evaluate.optimal_value(task),
            "seconds": round(time.perf_counter() - start, 1), "runs": runs}
  markdown = header(result) + reporting.render_markdown(
      reporting.bench_study(result, args.json or ""))
  if args.json:
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
      f.write(dumps(result))
  if args.markdown or args.json:
    write_markdown(args.markdown or os.path.splitext(args.json)[0] + ".md", markdown)
  print(markdown)


NOTES_MARKER = "<!-- notes: written by hand, kept when the bench rewrites this file -->"


def write_markdown(path: str, markdown: str) -> None:
  """Writes the bench's tables to `path`, keeping any hand-written part of the file that
  follows `NOTES_MARKER` (an explanation of the results stays with them across reruns)."""
  notes = ""
  if os.path.exists(path):
    with open(path) as f:
      old = f.read()
    if NOTES_MARKER in old:
      notes = "\n" + old[old.index(NOTES_MARKER):]
  with open(path, "w") as f:
    f.write(markdown.rstrip("\n") + "\n" + notes)


def dumps(result: dict) -> str:
  """The result as JSON with one line per run (diff-friendly, a few hundred kB)."""
  head = json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1)
  runs = ",\n".join("  " + json.dumps(r) for r in result["runs"])
  return head[:-2] + ',\n "runs": [\n' + runs + "\n ]\n}\n"


def header(result: dict) -> str:
  m = result["machine"]
  return (f"# Credit bench\n\nCommand: `{result['command']}`\n\n"
          f"Machine: {m['platform']}, {m['cpus']} CPUs, Python {m['python']}, jax {m['jax']} "
          f"({m['backend']}); {result['seconds']} s in all.\n\n"
          f"Task: {json.dumps(result['task'])}\n\nTraining: {json.dumps(result['train'])}\n\n"
          f"Rollouts: {json.dumps(result['rollouts'])}\n\n")


if __name__ == "__main__":
  main()
