"""A training run's directory: every file's name, its writers and its reader (`RunDir`).

    workdir/
      config.json      the resolved config (a restart must match it, see `claim`)
      cell.json        {"label", "estimator", "options", "seed"} for reports and ablations
                       (`write_cell`; a grid's runner adds "recipe" and "warm_start")
      status.json      {"state": "running" | "finished" | "failed", "error", "step"}
      metrics.jsonl    one object per line: {"phase": "sft" | "rl" | "eval", "step", "time", ...}
      eval_after_sft.json  the evaluation after SFT (before RL)
      summary.json     {"after_sft", "after_rl", "rl_steps", "policy_version", "seconds"} once
                       the run finished
      tensorboard/     the same scalars as TensorBoard event files
      wandb/           with "wandb" in train.loggers: W&B's local files of the run
                       (`tirjax.wandb_logger`; tirjax.json keeps the W&B run id)
      checkpoints/     Orbax train states (`tirjax.checkpoint`)
      reference/       the KL reference's parameters, saved once at RL's start (β > 0)
      hf_export/       the final policy as a Hugging Face directory

Nothing a user made is overwritten silently: a workdir holding another run's config is
refused, naming the keys that differ (only keys in `RESUMABLE_KEYS`, such as the number of
steps, may change on a restart).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
from typing import Any, Mapping, Optional

import numpy as np
from flax import traverse_util

from tirjax.metric_records import PHASES, tag
from tirjax.wandb_logger import WandbLogger

# Keys a restart may change: how long and how verbosely it runs, and where its processes meet
# (a resumed multi-process run may get other hosts; their number is part of the run).
RESUMABLE_KEYS = ("train.steps", "train.eval_every", "train.log_every", "train.progress_bar",
                  "train.loggers", "distributed.coordinator_address", "distributed.process_id")
LOGGERS = ("tensorboard", "wandb")  # metrics.jsonl is always written

# Every file of a run directory, named once (the trainer, the grid's runner and the reports
# all go through these and `RunDir`).
CONFIG, CELL, STATUS, METRICS = "config.json", "cell.json", "status.json", "metrics.jsonl"
EVAL_AFTER_SFT, SUMMARY = "eval_after_sft.json", "summary.json"
TENSORBOARD = "tensorboard"
WANDB = "wandb"  # W&B's own folder name (`wandb.init(dir=workdir)` makes it)
CHECKPOINTS, REFERENCE, HF_EXPORT = "checkpoints", "reference", "hf_export"


class WorkdirMismatch(RuntimeError):
  """The workdir belongs to a run with a different config."""


def flatten(d: Mapping[str, Any]) -> dict[str, Any]:
  """Nested mappings as one dict with dotted keys ({"a": {"b": 1}} → {"a.b": 1})."""
  return traverse_util.flatten_dict(dict(d), sep=".")


def read_json(path: str) -> Any:
  """The JSON value in the file at `path` (OSError or json.JSONDecodeError when it cannot be
  read)."""
  with open(path) as f:
    return json.load(f)


def write_json(path: str, obj: Any) -> None:
  """Writes atomically (a crash leaves the old file or the new one, never half of one)."""
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2, sort_keys=True, default=_jsonable)
  os.replace(tmp, path)


def _jsonable(x):
  if isinstance(x, (np.generic,)):
    return x.item()
  if isinstance(x, np.ndarray):
    return x.tolist()
  if isinstance(x, tuple):
    return list(x)
  return str(x)


def read_metrics(path: str) -> list[dict]:
  """The lines of a metrics.jsonl; a truncated last line (a run killed mid-write) is skipped."""
  with open(path) as f:
    texts = [(i, t) for i, t in enumerate(f.read().splitlines()) if t.strip()]
  lines = []
  for j, (i, text) in enumerate(texts):
    try:
      line = json.loads(text)
    except json.JSONDecodeError:
      if j < len(texts) - 1:  # a bad line before the last: the file is corrupt
        raise ValueError(f"{path}: line {i + 1} is not JSON") from None
      continue
    if not isinstance(line, dict):
      raise ValueError(f"{path}: line {i + 1} is not a JSON object")
    lines.append(line)
  return lines


@dataclasses.dataclass(frozen=True)
class RunDir:
  """The files of one trainer run directory, read when asked (a running trainer rewrites them).
  A missing or unreadable file raises (OSError, ValueError), except in `state`."""

  path: str

  def file(self, name: str) -> str:
    return os.path.join(self.path, name)

  def cell(self) -> dict:
    return read_json(self.file(CELL))

  def status(self) -> dict:
    return read_json(self.file(STATUS))

  def state(self) -> Optional[str]:
    """status.json's state; None before the run wrote a readable one."""
    try:
      return self.status().get("state")
    except (OSError, ValueError):
      return None

  def config(self) -> dict:
    return read_json(self.file(CONFIG))

  def eval_after_sft(self) -> dict:
    return read_json(self.file(EVAL_AFTER_SFT))

  def summary(self) -> dict:
    return read_json(self.file(SUMMARY))

  def metrics(self, phase: Optional[str] = None) -> list[dict]:
    """metrics.jsonl's lines (`read_metrics`), or only those of `phase` ("sft", "rl", "eval")."""
    lines = read_metrics(self.file(METRICS))
    return lines if phase is None else [x for x in lines if x.get("phase") == phase]


def write_cell(workdir: str, cell: Mapping[str, Any], keep: bool = False) -> None:
  """cell.json: {"label", "estimator", "options", "seed"} (a grid adds "recipe" and
  "warm_start"); with `keep`, an existing one is left as it is (a grid's runner wrote it)."""
  path = os.path.join(workdir, CELL)
  if not (keep and os.path.exists(path)):
    write_json(path, dict(cell))


def claim(workdir: str, config: Mapping[str, Any]) -> bool:
  """Creates `workdir` for this config, or checks that it is this run's. True if resuming."""
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, CONFIG)
  config = json.loads(json.dumps(config, default=_jsonable))
  if not os.path.exists(path):
    if any(n for n in os.listdir(workdir) if not n.startswith(".")):
      raise WorkdirMismatch(f"{workdir}: not empty and holds no config.json; refusing to write "
                            "a run into it (choose a new --workdir)")
    write_json(path, config)
    return False
  try:
    with open(path) as f:
      old = json.load(f)
  except ValueError as e:  # JSONDecodeError, or text that is not UTF-8
    raise WorkdirMismatch(f"{path}: cannot be read as JSON ({e}); restore it, or choose a new "
                          "--workdir") from e
  a, b = flatten(old), flatten(config)
  differ = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k) and k not in RESUMABLE_KEYS)
  if differ:
    shown = ", ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in differ[:8])
    raise WorkdirMismatch(f"{workdir} holds a run with another config ({shown}); resume it with "
                          "the same config or choose a new --workdir")
  write_json(path, config)  # resumable keys may have changed
  return True


def write_status(workdir: str, state: str, step: int, error: Optional[str] = None) -> None:
  write_json(os.path.join(workdir, STATUS),
             {"state": state, "step": int(step), "error": error, "time": time.time()})


def phase_steps(data_position: Mapping[str, Any]) -> dict[str, int]:
  """The last step of each phase that a checkpoint at `data_position` covers (what a resume
  from it keeps of metrics.jsonl). Evaluations count from RL's start: the one after SFT is
  RL's step 0, so a checkpoint inside SFT covers none."""
  rl = data_position["rl_step"] if data_position["phase"] == "rl" else -1
  return {"sft": data_position["sft_step"], "rl": max(rl, 0), "eval": rl}


class MetricsWriter:
  """Appends metric records to metrics.jsonl, TensorBoard (`{phase}/{name}` tags) and, with
  "wandb" among `loggers`, Weights & Biases (run `run_id`, with `config`).

  W&B gets a record once it is final, at or before a committed checkpoint (`checkpointed`,
  or the position `truncate_after` resumes from): a resume redoes the steps after that, and
  W&B keeps what it is sent, so each step goes there once, up to a checkpoint interval
  after metrics.jsonl.
  """

  def __init__(self, workdir: str, loggers=("tensorboard",), run_id: str = "",
               config: Optional[Mapping[str, Any]] = None):
    unknown = sorted(set(loggers) - set(LOGGERS))
    if unknown:
      raise ValueError(f"loggers: {unknown} unknown; the loggers are {LOGGERS}")
    self.path = os.path.join(workdir, METRICS)
    self._tb = self._wandb = None
    self._pending = []  # this process's records not yet final (W&B only)
    if "tensorboard" in loggers:
      from tensorboardX import SummaryWriter  # imported lazily: optional at library level
      self._tb = SummaryWriter(os.path.join(workdir, TENSORBOARD))
    if "wandb" in loggers:
      if not run_id:
        raise ValueError("run_id: the W&B logger needs the run's id (rundir.run_id)")
      self._wandb = WandbLogger(workdir, run_id, config or {})

  def truncate_after(self, phase_steps: Mapping[str, int]) -> None:
    """On resume: drops records logged after the restored step of each phase, so that the
    steps redone after a crash are not logged twice. Those kept are final: W&B gets any of
    them it lacks."""
    if not os.path.exists(self.path):
      return
    with open(self.path) as f:
      lines = f.readlines()
    keep = []
    for line in lines:
      try:
        rec = json.loads(line)
      except json.JSONDecodeError:
        continue  # a line cut by a crash
      if rec.get("step", 0) <= phase_steps.get(rec.get("phase"), math.inf):
        keep.append(line)
    tmp = self.path + ".tmp"
    with open(tmp, "w") as f:
      f.writelines(keep)
    os.replace(tmp, self.path)
    if self._wandb is not None:
      self._wandb.warn_if_ahead(phase_steps)
      self._wandb.send([json.loads(line) for line in keep])

  def write(self, phase: str, step: int, metrics: Mapping[str, Any]) -> dict:
    rec = _record(phase, step, metrics)
    with open(self.path, "a") as f:
      f.write(json.dumps(rec, default=_jsonable) + "\n")
    if self._tb is not None:
      for k, v in rec.items():
        if k not in ("phase", "step", "time") and isinstance(v, float) and math.isfinite(v):
          self._tb.add_scalar(tag(phase, k), v, step)
    if self._wandb is not None:
      self._pending.append(json.loads(json.dumps(rec, default=_jsonable)))
    return rec

  def checkpointed(self, data_position: Mapping[str, Any]) -> None:
    """A checkpoint at `data_position` is committed: the records it covers are final."""
    if self._wandb is not None:
      final = phase_steps(data_position)
      done = [r for r in self._pending if r["step"] <= final[r["phase"]]]
      self._pending = [r for r in self._pending if r["step"] > final[r["phase"]]]
      self._wandb.send(done)

  def summarize(self, summary: Mapping[str, Any]) -> None:
    """The finished run's summary (summary.json) as the W&B run's summary."""
    if self._wandb is not None:
      self._wandb.summarize(summary)

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()
    if self._wandb is not None:
      self._wandb.close()  # records still pending are redone by a resume, which sends them


def _record(phase: str, step: int, metrics: Mapping[str, Any]) -> dict:
  if phase not in PHASES:
    raise ValueError(f"phase: must be one of {PHASES}, got {phase!r}")
  rec = {"phase": phase, "step": int(step), "time": time.time()}
  for k, v in metrics.items():
    v = np.asarray(v).item() if np.ndim(v) == 0 else v
    rec[k] = float(v) if isinstance(v, (int, float, np.number)) and not isinstance(v, bool) else v
  return rec


class NullWriter:
  """`MetricsWriter`'s stand-in on the processes other than 0 of a multi-process run: it
  builds the records (the caller reads them) and writes nothing."""

  def truncate_after(self, phase_steps: Mapping[str, int]) -> None:
    del phase_steps

  def write(self, phase: str, step: int, metrics: Mapping[str, Any]) -> dict:
    return _record(phase, step, metrics)

  def checkpointed(self, data_position: Mapping[str, Any]) -> None:
    del data_position

  def summarize(self, summary: Mapping[str, Any]) -> None:
    del summary

  def close(self) -> None:
    pass


def run_id(config: Mapping[str, Any]) -> str:
  """A name for the run's identity: its config (as nested dicts, `resolve.config_record`)
  without the keys a restart may change."""
  flat = flatten(json.loads(json.dumps(dict(config), default=str)))
  kept = {k: v for k, v in flat.items() if k not in RESUMABLE_KEYS}
  digest = hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:12]
  return f"{config['advantage']['name']}-{digest}"
