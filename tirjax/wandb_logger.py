"""Weights & Biases as a second sink of a run's metrics (`train.loggers` holding "wandb").

`rundir.MetricsWriter` hands this logger the records of metrics.jsonl once they are final:
at or before the step of a committed checkpoint, which a resume never redoes. Each record
becomes one W&B history row with its phase's step under `{phase}/step` (the x-axis of the
phase's charts, `define_metric`) and every numeric value under `{phase}/{name}`, as in
TensorBoard. The run's id is kept in `workdir/wandb/tirjax.json` (its `rundir.run_id` and
a suffix drawn at the first start), so a resumed run continues the same W&B run and another
workdir with the same config gets its own.

What W&B already holds is read back from W&B's own transaction logs in `workdir/wandb/`
(`run-<id>.wandb`, written in online and offline mode alike; a start's folder is found by
the run id its log records, `run_dirs`), and the resumed run sends the final records missing
there. W&B's service writes that log in blocks (every 15 s and when a
block fills) and a killed process's service exits without writing its last one, so those
rows are lost in offline mode and sent again: each final record is in the offline files
once. Online, the service may have uploaded some of them before the kill; the server then
holds them twice, with the same values (a final record never changes). The mode, project
and entity are W&B's own settings (WANDB_MODE, WANDB_PROJECT, WANDB_ENTITY; project
"tirjax" by default). `WANDB_MODE=offline` writes only local files (`wandb sync` uploads them
later).
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
import secrets
import struct
import warnings
import zlib
from typing import Any, Iterator, Mapping, Sequence

from flax import traverse_util

from tirjax.metric_records import PHASES, tag

_HEADER = b":W&B\xe1\xbe\x00"  # W&B's transaction log: ident, magic, version
_BLOCK = 32768  # leveldb log blocks: records are framed and split at block ends
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4
# W&B's run folder: `[offline-]run-<start second>-<id>[-<n>]`
_FOLDER = re.compile(r"(?:offline-)?run-(\d{8}_\d{6})-(.+)")


def scalars(rec: Mapping[str, Any]) -> dict[str, float]:
  """A metrics.jsonl record's numeric values by their W&B names (the bookkeeping keys and
  strings such as `eval/stage` left out; NaN and infinities kept, W&B stores them)."""
  phase = rec["phase"]
  return {tag(phase, k): float(v) for k, v in rec.items()
          if k not in ("phase", "step", "time") and isinstance(v, (int, float))
          and not isinstance(v, bool)}


def run_dirs(workdir: str, run_id: str | None = None) -> list[str]:
  """W&B's local folders of `workdir`'s runs (online `run-*` and `offline-run-*`), oldest
  first; only those whose transaction log records `run_id` when given.

  A folder is named `<mode>-<start second>-<id>`, and W&B appends `-1`, `-2`, ... when that
  name is taken (a resume in the same second as the last start), so the name's tail is not
  the id: the id is the one the folder's log records (`recorded_run_id`). A log cut before
  W&B's first write records none, and holds no rows either."""
  dirs = [d for d in glob.glob(os.path.join(workdir, "wandb", "*run-*"))
          if _FOLDER.fullmatch(os.path.basename(d)) and os.path.isdir(d)]
  if run_id is not None:
    dirs = [d for d in dirs if recorded_run_id(d) == run_id]
  return sorted(dirs, key=_start_order)


def _start_order(folder: str) -> tuple[str, int, str]:
  """Sorts W&B's folders by start: by their start second, then in one second the unsuffixed
  name, then `-1`, `-2`, ..., `-10` (a longer tail is a later start)."""
  second, tail = _FOLDER.fullmatch(os.path.basename(folder)).groups()
  return second, len(tail), tail


def recorded_run_id(folder: str) -> str | None:
  """The W&B run id that the run record of `folder`'s transaction log holds (None: no log,
  or one cut before its run record)."""
  for record in _records(folder):
    if record.WhichOneof("record_type") == "run":
      return record.run.run_id
  return None


def _records(folder: str) -> Iterator[Any]:
  """The parsed records of the transaction log(s) in one of W&B's run folders."""
  from wandb.proto import wandb_internal_pb2  # pylint: disable=import-outside-toplevel
  for path in sorted(glob.glob(os.path.join(folder, "run-*.wandb"))):
    for raw in read_log(path):
      record = wandb_internal_pb2.Record()
      record.ParseFromString(raw)
      yield record


def read_log(path: str) -> Iterator[bytes]:
  """The records of one W&B transaction log (`run-<id>.wandb`): leveldb log framing with a
  CRC-32 per fragment. A record cut short by a kill ends the log; a bad checksum stops it
  there too (what follows cannot be trusted)."""
  with open(path, "rb") as f:
    data = f.read()
  if not data.startswith(_HEADER):
    raise ValueError(f"{path}: not a W&B transaction log (header {data[:7]!r})")
  pos, parts = len(_HEADER), []
  while pos + 7 <= len(data):
    left = _BLOCK - pos % _BLOCK
    if left < 7:  # a block's tail too short for a fragment header is zero padding
      pos += left
      continue
    crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
    body = data[pos + 7:pos + 7 + length]
    if kind == 0 and length == 0:  # padding to the block's end
      pos += left
      continue
    if len(body) < length or zlib.crc32(bytes([kind]) + body) != crc:
      return
    pos += 7 + length
    if kind == _FULL:
      yield body
    elif kind == _FIRST:
      parts = [body]
    elif kind == _MIDDLE:
      parts.append(body)
    elif kind == _LAST:
      yield b"".join(parts + [body])
      parts = []


def read_run(workdir: str, run_id: str | None = None) -> dict[str, Any]:
  """What W&B recorded locally for `workdir` (all its processes' transaction logs, oldest
  first): {"history": [{name: value} per row, `_step`, `_runtime` and `_timestamp` included],
  "config": {key: value}, "summary": {name: value}}, the last two as their updates leave them."""
  out = {"history": [], "config": {}, "summary": {}}
  for d in run_dirs(workdir, run_id):
    for record in _records(d):
      kind = record.WhichOneof("record_type")
      if kind == "history":
        out["history"].append(_items(record.history.item))
      elif kind == "run":  # the config passed to wandb.init
        out["config"].update(_items(record.run.config.update))
      elif kind in ("config", "summary"):
        out[kind].update(_items(getattr(record, kind).update))
  return out


def _items(items) -> dict[str, Any]:
  return {".".join(i.nested_key) if i.nested_key else i.key: json.loads(i.value_json)
          for i in items}


def sent_steps(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
  """The last step of each phase among W&B history rows (-inf where it has none)."""
  sent = dict.fromkeys(PHASES, -math.inf)
  for row in rows:
    for phase in PHASES:
      if f"{phase}/step" in row:
        sent[phase] = max(sent[phase], row[f"{phase}/step"])
  return sent


def wandb_id(workdir: str, run_id: str) -> str:
  """The W&B id of the run in `workdir`: `run_id` and a suffix drawn at its first start,
  kept in `workdir/wandb/tirjax.json`."""
  path = os.path.join(workdir, "wandb", "tirjax.json")
  if os.path.exists(path):
    with open(path) as f:
      return json.load(f)["id"]
  os.makedirs(os.path.dirname(path), exist_ok=True)
  wid = f"{run_id}-{secrets.token_hex(3)}"
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump({"id": wid, "run_id": run_id}, f)
  os.replace(tmp, path)
  return wid


class WandbLogger:
  """One W&B run per run directory; `send` final records, `summarize` the summary."""

  def __init__(self, workdir: str, run_id: str, config: Mapping[str, Any]):
    try:
      import wandb  # pylint: disable=import-outside-toplevel
    except ImportError as e:
      raise ImportError("train.loggers has 'wandb' but wandb is not installed: "
                        "pip install 'tirjax[wandb]' (or wandb)") from e
    self.workdir = os.path.abspath(workdir)
    self.id = wandb_id(self.workdir, run_id)
    self.sent = sent_steps(read_run(self.workdir, self.id)["history"])
    self._run = wandb.init(
        id=self.id, resume="allow", dir=self.workdir, config=dict(config),
        project=os.environ.get("WANDB_PROJECT") or "tirjax", name=os.path.basename(self.workdir),
        reinit="create_new", settings=wandb.Settings(console="off"))
    for phase in PHASES:
      self._run.define_metric(f"{phase}/step")
      self._run.define_metric(f"{phase}/*", step_metric=f"{phase}/step")

  def send(self, records: Sequence[Mapping[str, Any]]) -> None:
    """Logs each record not yet in W&B (its step above its phase's last sent one)."""
    for rec in records:
      phase, step = rec["phase"], rec["step"]
      if step > self.sent[phase]:
        self._run.log({f"{phase}/step": step, **scalars(rec)})
        self.sent[phase] = step

  def warn_if_ahead(self, final: Mapping[str, float]) -> None:
    """On resume: W&B holding steps past the restored checkpoint means a newer checkpoint
    was unreadable (`tirjax.checkpoint` moved it aside); the redone steps are not sent again."""
    ahead = {p: (final[p], s) for p, s in self.sent.items() if s > final.get(p, -math.inf)}
    if ahead:
      warnings.warn(f"W&B run {self.id} holds steps past the resumed checkpoint "
                    f"({', '.join(f'{p}: {s:g} > {f:g}' for p, (f, s) in ahead.items())}): "
                    "those steps keep their first values there")

  def summarize(self, summary: Mapping[str, Any]) -> None:
    flat = traverse_util.flatten_dict(dict(summary), sep="/")
    self._run.summary.update({k: v for k, v in flat.items()
                              if isinstance(v, (int, float, str)) and not isinstance(v, bool)})

  def close(self) -> None:
    import wandb  # pylint: disable=import-outside-toplevel
    self._run.finish()
    # W&B's service writes the transaction log after `finish` returns; its teardown waits
    # for that, so that the files are whole when the run directory is closed.
    wandb.teardown()

