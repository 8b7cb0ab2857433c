"""experiments.ablate end to end on the smoke grid of configs/ablate.py: grpo and portool × 2
seeds, two-step runs of the tiny model on toolworld from one SFT warm start per seed. Every run
finishes and is reported; a rerun skips the finished runs and resumes a failed and a killed
one; a bad grid fails before any compute."""

import json
import os
import re
import subprocess
import sys

import pytest

from tirjax import rundir

pytestmark = [pytest.mark.xdist_group("ablate"), pytest.mark.slow,
              pytest.mark.cores(2)]  # the grid at --parallel=2

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# One CPU device: the smoke batches (2 rows) do not split over conftest's 8 simulated devices.
ENV = {**os.environ, "XLA_FLAGS": "--xla_backend_optimization_level=0", "JAX_PLATFORMS": "cpu"}
RL_RUNS = ["grpo seed0", "portool seed0", "grpo seed1", "portool seed1"]


def ablate(workdir, *flags, config="configs/ablate.py:grid=smoke"):
  return subprocess.run([sys.executable, "-m", "experiments.ablate", f"--config={config}",
                         f"--workdir={workdir}", *flags],
                        capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=900)


def progress(stdout):
  """{run name: the text of its last progress line}."""
  return {m[1]: m[2] for m in re.finditer(r"^\[\d+/6\] (.+? seed\d): (.*)$", stdout, re.M)}


def read(path):
  with open(path) as f:
    return json.load(f) if path.endswith(".json") else [json.loads(x) for x in f]


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("ablate") / "grid")
  proc = ablate(workdir, "--parallel=2")
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return workdir, proc.stdout


def warm_label(workdir):
  (label,) = [d for d in os.listdir(workdir) if d.startswith("sft-")]
  return label


def test_every_run_finishes_from_its_warm_start_and_is_reported(grid):
  workdir, stdout = grid
  warm = warm_label(workdir)
  lines = progress(stdout)
  assert sorted(lines) == sorted(RL_RUNS + [f"{warm} seed0", f"{warm} seed1"])
  assert all(re.fullmatch(r"finished in \d+\.\d s", text) for text in lines.values())
  for seed in (0, 1):
    warm_dir = os.path.join(workdir, warm, f"seed{seed}")
    config = read(os.path.join(warm_dir, "config.json"))
    assert (config["seed"], config["train"]["steps"], config["sft"]["steps"]) == (seed, 0, 2)
    phases = [x["phase"] for x in read(os.path.join(warm_dir, "metrics.jsonl"))]
    assert phases.count("sft") == 2 and "rl" not in phases
    assert os.path.isfile(os.path.join(warm_dir, "hf_export", "config.json"))
    for estimator in ("grpo", "portool"):
      run = os.path.join(workdir, estimator, f"seed{seed}")
      cell = read(os.path.join(run, "cell.json"))
      assert {k: cell[k] for k in ("label", "estimator", "options", "seed")} == {
          "label": estimator, "estimator": estimator, "options": {}, "seed": seed}
      assert read(os.path.join(run, "status.json"))["state"] == "finished"
      config = read(os.path.join(run, "config.json"))
      assert config["model"]["hf_checkpoint"] == os.path.join(os.path.abspath(warm_dir),
                                                              "hf_export")
      assert (config["seed"], config["sft"]["steps"], config["train"]["steps"]) == (seed, 0, 2)
      assert config["rollout"]["mode"] == ("tree" if estimator == "portool" else "independent")
      metrics = read(os.path.join(run, "metrics.jsonl"))
      assert [x["step"] for x in metrics if x["phase"] == "rl"] == [1, 2]
      assert not any(x["phase"] == "sft" for x in metrics)
  with open(os.path.join(workdir, "report", "report.md")) as f:
    report = f.read()
  for label in (warm, "grpo", "portool"):
    assert re.search(rf"^\| {label} \| 2 \| ok \|", report, re.M), label
  assert "All runs finished with metrics." in report
  assert os.path.isfile(os.path.join(workdir, "report", "summary.csv"))
  assert "6/6 runs finished" in stdout


def test_a_rerun_skips_finished_runs_and_resumes_failed_and_killed_ones(grid):
  workdir, _ = grid
  warm = warm_label(workdir)
  runs = {f"{label} seed{seed}": os.path.join(workdir, label, f"seed{seed}")
          for label in (warm, "grpo", "portool") for seed in (0, 1)}
  rundir.write_status(runs["grpo seed1"], "failed", 1, "RuntimeError: boom")
  rundir.write_status(runs["portool seed0"], "running", 1)  # a run killed mid-way
  redo = {"grpo seed1": "failed", "portool seed0": "running"}
  before = {name: (read(os.path.join(d, "status.json"))["time"],
                   os.path.getsize(os.path.join(d, "train.log"))) for name, d in runs.items()}
  proc = ablate(workdir, "--parallel=2")
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "6 runs (2 warm starts), 4 finished earlier, 2 to run" in proc.stdout
  lines = progress(proc.stdout)
  for name, d in runs.items():
    status = read(os.path.join(d, "status.json"))
    assert status["state"] == "finished"
    if name in redo:
      assert f"{name}: started (was {redo[name]})" in proc.stdout
      assert re.fullmatch(r"finished in \d+\.\d s", lines[name])
      assert status["time"] > before[name][0]
      with open(os.path.join(d, "train.log")) as f:
        assert f"resumed {d} at rl step 2" in f.read()[before[name][1]:]
    else:
      assert lines[name] == "finished earlier, skipped"
      assert (status["time"], os.path.getsize(os.path.join(d, "train.log"))) == before[name]


def test_the_documented_ablate_and_report_commands_run_as_written(grid, tmp_path):
  """Issue 41: the grid above is the documented smoke command (README.md, configs/ablate.py),
  and the documented report command runs on it end to end."""
  from tirjax.testing.doc_commands import collect  # pylint: disable=import-outside-toplevel
  workdir, _ = grid
  documented = {(c.module, c.text) for c in collect(ROOT)}
  assert ("experiments.ablate", "--config=configs/ablate.py:grid=smoke --workdir=/tmp/smoke") \
      in documented  # as ablate() runs it, in another directory
  assert ("experiments.report", "runs/ablate --out=report/") in documented
  out = tmp_path / "report"
  proc = subprocess.run([sys.executable, "-m", "experiments.report", workdir, f"--out={out}"],
                        capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert re.search(r"^\| grpo \| 2 \| ok \|", proc.stdout, re.M) and (out / "report.md").is_file()
  assert (out / "summary.csv").is_file() and (out / "paired.csv").is_file()


def test_a_bad_grid_fails_before_any_compute(tmp_path):
  workdir = str(tmp_path / "grid")
  proc = ablate(workdir, "--config.cells=('grpo','portool/no_such_option=1')")
  assert proc.returncode != 0
  assert "cells[1] 'portool/no_such_option=1': unknown config key " \
      "'advantage.options.no_such_option'" in proc.stderr
  assert not os.path.exists(workdir)
