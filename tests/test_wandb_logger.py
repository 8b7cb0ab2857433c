"""The W&B logger (`train.loggers` with "wandb", issue 28), offline: what W&B recorded is read
back from its own transaction logs in the run directory. Every scalar of metrics.jsonl is
there at its phase's step, once, also after kills and a resume; the config and the summary
are there; a resumed run continues the same W&B run."""

import json
import math
import os
import struct
import subprocess
import types
import zlib

import pytest

from tirjax import rundir, wandb_logger
from tirjax.rundir import RunDir
from tirjax.testing.short_runs import SFT_THEN_RL, kill_when, logged, train_command
from tirjax.trainer import sections

pytest.importorskip("wandb")

# Offline, and any connection W&B might still try goes to a closed local port.
OFFLINE = {"WANDB_MODE": "offline", "WANDB_BASE_URL": "http://127.0.0.1:9",
           "WANDB_SILENT": "true"}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
  for key, value in OFFLINE.items():
    monkeypatch.setenv(key, value)
  monkeypatch.delenv("WANDB_API_KEY", raising=False)


def assert_mirrors_metrics(workdir):
  """Every numeric value of metrics.jsonl is in exactly one W&B row, the row of its phase's
  step, with the same value; and W&B holds nothing else."""
  rows = wandb_logger.read_run(str(workdir))["history"]
  expected = {}
  for rec in RunDir(str(workdir)).metrics():
    key = (rec["phase"], rec["step"])
    assert key not in expected, f"metrics.jsonl holds {key} twice"
    expected[key] = wandb_logger.scalars(rec)
  seen = {}
  for row in rows:
    [phase] = [p for p in rundir.PHASES if f"{p}/step" in row]
    key = (phase, row[f"{phase}/step"])
    assert key not in seen, f"W&B holds {key} twice"
    seen[key] = {k: v for k, v in row.items() if not k.startswith("_") and k != f"{phase}/step"}
  assert seen.keys() == expected.keys()
  for key, values in expected.items():
    assert seen[key].keys() == values.keys(), key
    for name, value in values.items():
      got = seen[key][name]
      assert got == value or (math.isnan(got) and math.isnan(value)), (key, name, got, value)
  return rows


def test_records_reach_wandb_once_each_when_their_checkpoint_commits(tmp_path):
  config = {"seed": 3, "train": {"steps": 5}}
  w = rundir.MetricsWriter(str(tmp_path), ("wandb",), "grpo-0123", config)
  for i in range(1, 6):
    w.write("rl", i, {"loss/loss": 0.1 * i, "reward/mean": math.nan if i == 2 else float(i)})
  w.write("eval", 4, {"eval/accuracy": 0.5, "eval/stage": "start"})
  w.checkpointed({"phase": "rl", "sft_step": 0, "rl_step": 4})
  w.close()  # steps 5 are not final: a resume redoes them
  run = wandb_logger.read_run(str(tmp_path))
  assert [r.get("rl/step") for r in run["history"]] == [1, 2, 3, 4, None]
  assert run["config"]["seed"] == 3 and run["config"]["train"] == {"steps": 5}
  # Resumed from the checkpoint at 4: step 5 is redone with other values and sent once.
  w = rundir.MetricsWriter(str(tmp_path), ("wandb",), "grpo-0123", config)
  w.truncate_after(rundir.phase_steps({"phase": "rl", "sft_step": 0, "rl_step": 4}))
  w.write("rl", 5, {"loss/loss": 0.55, "reward/mean": 5.5})
  w.checkpointed({"phase": "rl", "sft_step": 0, "rl_step": 5})
  w.summarize({"after_rl": {"eval/accuracy": 0.5}, "rl_steps": 5})
  w.close()
  assert_mirrors_metrics(tmp_path)
  run = wandb_logger.read_run(str(tmp_path))
  assert run["summary"]["after_rl/eval/accuracy"] == 0.5
  wid = json.load(open(tmp_path / "wandb" / "tirjax.json"))["id"]
  dirs = wandb_logger.run_dirs(str(tmp_path))
  # one W&B run, resumed (the second folder's name ends in "-1" when both starts fell in
  # one second: what the logs record tells the run, not the names)
  assert len(dirs) == 2 and wandb_logger.run_dirs(str(tmp_path), wid) == dirs
  assert [wandb_logger.recorded_run_id(d) for d in dirs] == [wid, wid]


@pytest.fixture
def one_second(monkeypatch):
  """W&B's start clock stopped at one instant: every start falls in the same second, so
  each resume's folder gets the next suffix (`...-<id>-1`, `-2`, ...). Only the start time
  W&B names its folder by is fixed (`wandb_init` reads the clock for nothing else)."""
  from wandb.sdk import wandb_init  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(wandb_init, "time", types.SimpleNamespace(time=lambda: 1.7e9))


def test_quick_restarts_send_each_row_once(tmp_path, one_second):
  """Issue 42: five starts of one run in one second, each resumed from the last checkpoint,
  sending one step each; a resume that missed the suffixed folders sent [1, 2, 2, 3, 4, 4, 5]
  (it read W&B's rows from the first folder only)."""
  del one_second
  config = {"seed": 3}
  for k in range(5):
    w = rundir.MetricsWriter(str(tmp_path), ("wandb",), "grpo-0123", config)
    w.truncate_after(rundir.phase_steps({"phase": "rl", "sft_step": 0, "rl_step": k}))
    w.write("rl", k + 1, {"loss/loss": float(k + 1)})
    w.checkpointed({"phase": "rl", "sft_step": 0, "rl_step": k + 1})
    w.summarize({"rl_steps": k + 1})
    w.close()
  assert [r["rl/step"] for r in assert_mirrors_metrics(tmp_path)] == [1, 2, 3, 4, 5]
  wid = json.load(open(tmp_path / "wandb" / "tirjax.json"))["id"]
  dirs = wandb_logger.run_dirs(str(tmp_path), wid)
  names = [os.path.basename(d) for d in dirs]
  assert names == [names[0]] + [f"{names[0]}-{i}" for i in range(1, 5)]  # one second
  assert wandb_logger.read_run(str(tmp_path))["summary"]["rl_steps"] == 5  # the last start's


def test_run_folders_are_ordered_by_start_and_others_ignored(tmp_path):
  """Oldest first: by start second, then W&B's suffixes as numbers (-2 before -10); what is
  not a W&B run folder is left out."""
  starts = ["offline-run-20240101_000000-x-1a2b3c", "offline-run-20240101_000001-x-1a2b3c"]
  starts += [f"{starts[1]}-{i}" for i in (1, 2, 10)]
  for name in starts + ["latest-run", "my-run-notes", "run-x"]:
    os.makedirs(tmp_path / "wandb" / name)
  (tmp_path / "wandb" / "run-20240101_000002-file").write_text("")  # a file, not a folder
  assert wandb_logger.run_dirs(str(tmp_path)) == [str(tmp_path / "wandb" / n) for n in starts]
  assert wandb_logger.run_dirs(str(tmp_path), "x-1a2b3c") == []  # no log records the id


def test_final_records_a_killed_process_never_sent_are_sent_on_resume(tmp_path):
  """A checkpoint committed just before a kill: its records are final but were never sent;
  the resumed writer reads what W&B holds and sends the rest from metrics.jsonl."""
  w = rundir.MetricsWriter(str(tmp_path), ("wandb",), "grpo-0123", {})
  for i in range(1, 4):
    w.write("rl", i, {"loss/loss": float(i)})
  w.checkpointed({"phase": "rl", "sft_step": 0, "rl_step": 1})
  w.close()  # as a kill would: steps 2 and 3 were never sent
  w = rundir.MetricsWriter(str(tmp_path), ("wandb",), "grpo-0123", {})
  w.truncate_after(rundir.phase_steps({"phase": "rl", "sft_step": 0, "rl_step": 2}))
  w.close()
  rows = assert_mirrors_metrics(tmp_path)
  assert [r["rl/step"] for r in rows] == [1, 2]


def test_another_workdir_with_the_same_config_is_another_wandb_run(tmp_path):
  for name in ("a", "b"):
    os.makedirs(tmp_path / name)
    w = rundir.MetricsWriter(str(tmp_path / name), ("wandb",), "grpo-0123", {})
    w.close()
  ids = [json.load(open(tmp_path / n / "wandb" / "tirjax.json"))["id"] for n in ("a", "b")]
  assert ids[0] != ids[1] and all(i.startswith("grpo-0123-") for i in ids)


def test_transaction_log_reader_joins_fragments_and_stops_at_a_cut(tmp_path):
  """Records longer than a block are split in fragments; a kill can cut the last one."""
  w = rundir.MetricsWriter(str(tmp_path), ("wandb",), "grpo-0123", {})
  for i in range(1, 301):
    w.write("rl", i, {f"m{j}": float(i * j) for j in range(30)})  # ~300 KiB: many blocks
  w.checkpointed({"phase": "rl", "sft_step": 0, "rl_step": 300})
  w.close()
  [path] = [os.path.join(d, f) for d in wandb_logger.run_dirs(str(tmp_path))
            for f in os.listdir(d) if f.endswith(".wandb")]
  data = open(path, "rb").read()
  assert len(data) > 4 * wandb_logger._BLOCK
  kinds = set()
  pos = len(wandb_logger._HEADER)
  while pos + 7 <= len(data):  # every fragment's checksum holds, and some are split
    left = wandb_logger._BLOCK - pos % wandb_logger._BLOCK
    if left < 7:
      pos += left
      continue
    crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
    if kind == 0:
      break
    assert zlib.crc32(bytes([kind]) + data[pos + 7:pos + 7 + length]) == crc
    kinds.add(kind)
    pos += 7 + length
  assert {wandb_logger._FIRST, wandb_logger._LAST} <= kinds
  assert [r["rl/step"] for r in assert_mirrors_metrics(tmp_path)] == list(range(1, 301))
  cut = tmp_path / "cut.wandb"
  cut.write_bytes(data[:len(data) * 2 // 3])
  records = list(wandb_logger.read_log(str(cut)))
  assert 0 < len(records) < len(list(wandb_logger.read_log(path)))
  flipped = bytearray(data)
  flipped[len(data) // 2] ^= 0xFF
  cut.write_bytes(bytes(flipped))
  assert len(list(wandb_logger.read_log(str(cut)))) < len(list(wandb_logger.read_log(path)))


def test_unknown_logger_is_refused_by_name(tmp_path):
  with pytest.raises(ValueError, match="loggers: .*'mlflow'"):
    rundir.MetricsWriter(str(tmp_path), ("tensorboard", "mlflow"))
  for bad in (("tensorboard", "mlflow"), ("wandb", "wandb"), "wandb"):
    with pytest.raises(ValueError, match="loggers: must be distinct names"):
      sections.TrainOptions(loggers=bad)
  assert sections.TrainOptions(loggers=("wandb",)).loggers == ("wandb",)


@pytest.mark.slow
def test_trainer_logs_to_wandb_through_kills_and_a_resume(tmp_path):
  """SFT then RL, killed at an SFT step and at an RL step (seeded), then resumed to the end:
  W&B holds every scalar of metrics.jsonl at its step once, the config and the summary."""
  steps = 4
  env = {**os.environ, **OFFLINE, "PYTHONPATH": os.getcwd()}
  env.pop("WANDB_API_KEY", None)
  workdir = tmp_path / "run"
  command = train_command(workdir, steps) + [f"--config.{k}={v}" for k, v in SFT_THEN_RL.items()]
  command += ["--config.train.loggers=('tensorboard', 'wandb')"]
  kill_when(command, env, logged(workdir, "sft", 2), tmp_path / "first.log", "SFT step 2")
  kill_when(command, env, logged(workdir, "rl", 3), tmp_path / "second.log", "RL step 3")
  assert json.load(open(workdir / "status.json"))["state"] == "running"  # killed, not finished
  subprocess.run(command, check=True, env=env, capture_output=True)
  rows = assert_mirrors_metrics(workdir)
  assert {p for p in rundir.PHASES for r in rows if f"{p}/step" in r} == {"sft", "rl", "eval"}
  assert len(wandb_logger.run_dirs(str(workdir))) == 3  # three processes, one W&B run
  run = wandb_logger.read_run(str(workdir))
  config = json.load(open(workdir / "config.json"))
  assert run["config"]["advantage"] == config["advantage"]
  assert run["config"]["train"]["loggers"] == ["tensorboard", "wandb"]
  summary = json.load(open(workdir / "summary.json"))
  assert run["summary"]["after_rl/eval/accuracy"] == summary["after_rl"]["eval/accuracy"]
  assert run["summary"]["rl_steps"] == steps
