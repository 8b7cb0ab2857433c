"""Loading results: trainer run directories and credit-bench JSON files, as one `Study`.

A trainer run directory (its files named, written and read by `tirjax.rundir.RunDir`) holds
  cell.json     {"label", "estimator", "options", "seed"}
  status.json   {"state": "running" | "finished" | "failed", "error", "step"}
  metrics.jsonl one object per line: {"phase": "sft" | "rl" | "eval", "step", "time", ...}
  config.json   the resolved config
  eval_after_sft.json, summary.json   the evaluation after SFT; {"after_sft", "after_rl",
                "rl_steps", "policy_version", "seconds"} once the run finished
Its final metrics are the last eval line's, `gain/accuracy` (the last eval accuracy minus the
first, evaluated before RL, or, for a run from a grid's warm start (cell.json "warm_start"),
minus that warm start's evaluation after SFT), the mean "reward/mean" of the last `last_rl` RL
lines, and the unlearning rates averaged over RL lines (lines whose batch had no necessary
step, "unlearning/num_necessary" = 0 where logged, carry no rate and are skipped).

A run is *ok* when it finished and has final metrics; every other run stays in the study with
its state ("failed", "running", "no metrics", "unreadable") so that tables show it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Optional

from tirjax.rundir import CELL, METRICS, STATUS, RunDir, read_json

OK = "finished"

TRAIN_METRICS = ("gain/accuracy", "eval/accuracy", "eval/avg_steps", "eval/unanswerable_rate",
                 "eval/format_reward", "eval/solve_f1", "reward/mean", "unlearning/rate",
                 "unlearning/row_rate")
# eval/subset/accuracy: every evaluation's accuracy on the same first `train.eval_subset` tasks
TRAIN_CURVES = ("reward/mean", "eval/accuracy", "eval/subset/accuracy")
BENCH_METRICS = ("eval/success", "eval/greedy_success", "eval/mean_outcome", "eval/avg_steps",
                 "eval/early_answer_rate", "reached_threshold", "episodes_to_threshold",
                 "reward/mean",
                 "unlearning/rate", "unlearning/row_rate", "unlearning/pooled_rate")
BENCH_CURVES = ("success", "mean_outcome")


@dataclasses.dataclass
class Run:
  """One (cell, seed): its state, final metrics and curves (name → (x, y))."""

  label: str
  seed: int
  state: str
  error: Optional[str] = None
  final: dict = dataclasses.field(default_factory=dict)
  curves: dict = dataclasses.field(default_factory=dict)
  source: str = ""

  @property
  def ok(self) -> bool:
    return self.state == OK and bool(self.final)


@dataclasses.dataclass
class Study:
  """Runs with the metrics to tabulate and the curves to plot, in order."""

  runs: list
  metrics: tuple
  curves: tuple
  x_label: str
  baseline: str = "grpo"

  def labels(self) -> list[str]:
    """Cell labels in first-seen order."""
    return list(dict.fromkeys(r.label for r in self.runs))


def _number(v) -> Optional[float]:
  if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
    return None
  return float(v)


def final_metrics(lines: list[dict], last_rl: int = 5) -> dict:
  """Final metrics of a run from its metrics lines (see the module docstring)."""
  rl = [x for x in lines if x.get("phase") == "rl"]
  evals = [x for x in lines if x.get("phase") == "eval"]
  out = {}
  if evals:
    out.update({k: _number(v) for k, v in evals[-1].items() if k.startswith("eval/")})
    first, last = _number(evals[0].get("eval/accuracy")), _number(evals[-1].get("eval/accuracy"))
    if len(evals) > 1 and first is not None and last is not None:
      out["gain/accuracy"] = last - first
  rewards = [_number(x.get("reward/mean")) for x in rl[-last_rl:]]
  rewards = [v for v in rewards if v is not None]
  if rewards:
    out["reward/mean"] = sum(rewards) / len(rewards)
  counted = [x for x in rl if _number(x.get("unlearning/num_necessary", 1)) != 0]
  for key in ("unlearning/rate", "unlearning/row_rate"):
    values = [_number(x.get(key)) for x in counted]
    values = [v for v in values if v is not None]
    if values:
      out[key] = sum(values) / len(values)
  return out


def _curve(lines: list[dict], phase: str, key: str):
  points = [(x.get("step"), _number(x.get(key))) for x in lines if x.get("phase") == phase]
  points = [(s, v) for s, v in points if _number(s) is not None and v is not None]
  return [float(s) for s, _ in points], [v for _, v in points]


def load_run_dir(path: str, last_rl: int = 5) -> Run:
  """One trainer run directory as a `Run`; problems become its state, never an exception."""
  files = RunDir(path)
  try:
    cell = files.cell()
  except (OSError, json.JSONDecodeError) as e:
    return Run(label=os.path.basename(os.path.normpath(path)), seed=-1, state="unreadable",
               error=f"{CELL}: {e}", source=path)
  run = Run(label=str(cell.get("label", cell.get("estimator", "?"))),
            seed=int(cell.get("seed", -1)), state="unknown", source=path)
  try:
    status = files.status()
    run.state, run.error = str(status.get("state", "unknown")), status.get("error")
  except (OSError, json.JSONDecodeError) as e:
    run.state, run.error = "unknown", f"{STATUS}: {e}"
  try:
    lines = files.metrics() if os.path.exists(files.file(METRICS)) else []
  except (OSError, ValueError) as e:
    run.state, run.error, lines = "unreadable", str(e), []
  run.final = final_metrics(lines, last_rl)
  warm = cell.get("warm_start")
  if "gain/accuracy" not in run.final and warm and run.final.get("eval/accuracy") is not None:
    try:  # an RL run from a shared warm start: its baseline is the warm start's evaluation
      start = _number(RunDir(warm).eval_after_sft().get("eval/accuracy"))
    except (OSError, json.JSONDecodeError):
      start = None
    if start is not None:
      run.final["gain/accuracy"] = run.final["eval/accuracy"] - start
  run.curves = {"reward/mean": _curve(lines, "rl", "reward/mean"),
                "eval/accuracy": _curve(lines, "eval", "eval/accuracy"),
                "eval/subset/accuracy": _curve(lines, "eval", "eval/subset/accuracy")}
  if run.state == OK and not any(k.startswith("eval/") for k in run.final):
    run.state, run.error = "no metrics", run.error or "finished without an eval line"
  return run


def find_run_dirs(root: str) -> list[str]:
  """`root` itself if it holds a cell.json, else every directory below it that does."""
  if os.path.exists(os.path.join(root, CELL)):
    return [root]
  found = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames.sort()
    if CELL in filenames:
      found.append(dirpath)
      dirnames[:] = []
  return found


def load_run_dirs(paths: list[str], last_rl: int = 5, baseline: str = "grpo") -> Study:
  """Every run directory under `paths`; a path without any is an error (never ignored)."""
  runs = []
  for path in paths:
    dirs = find_run_dirs(path)
    if not dirs:
      raise FileNotFoundError(f"{path}: no run directory (no cell.json) found")
    runs += [load_run_dir(d, last_rl) for d in dirs]
  return Study(runs, TRAIN_METRICS, TRAIN_CURVES, "step", baseline)


def bench_study(data: dict, source: str = "", baseline: str = "grpo") -> Study:
  """A credit-bench result (the JSON object of `experiments.studies.credit_bench`) as a `Study`."""
  if "runs" not in data:
    raise ValueError(f"{source or 'data'}: not a credit-bench result (no 'runs')")
  runs = []
  for r in data["runs"]:
    curve = r.get("curve") or {}
    x = curve.get("episodes", [])
    runs.append(Run(label=r["label"], seed=int(r["seed"]), state=r["state"], error=r.get("error"),
                    final={k: _number(v) for k, v in (r.get("final") or {}).items()},
                    curves={k: (x, curve[k]) for k in BENCH_CURVES if k in curve},
                    source=source))
  return Study(runs, BENCH_METRICS, BENCH_CURVES, "episodes", baseline)


def load_bench(path: str, baseline: str = "grpo") -> Study:
  """A credit-bench JSON file as a `Study`."""
  return bench_study(read_json(path), path, baseline)


def load(paths: list[str], last_rl: int = 5, baseline: str = "grpo") -> Study:
  """Run directories, or one credit-bench JSON file."""
  files = [p for p in paths if os.path.isfile(p)]
  if files:
    if len(paths) != 1:
      raise ValueError(f"give either run directories or one bench JSON file, got {paths}")
    return load_bench(files[0], baseline)
  return load_run_dirs(paths, last_rl, baseline)
