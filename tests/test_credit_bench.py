"""The credit bench: Theorem 3.1 in numbers on the designed task, the training loop, cells and
the bench and its command line (tirjax.credit.cells/train/bench,
experiments.studies.credit_bench)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tirjax import reporting
from tirjax.credit import bench
from tirjax.credit import ChainTask, ChainRolloutOptions, CreditTrainOptions, cells, parse_cell, run_cell
from tirjax.loss import LossOptions

TASK = ChainTask()


def train(label, iterations, seed=0):
  return run_cell(TASK, parse_cell(label, ChainRolloutOptions(), TASK.max_steps), seed,
                  CreditTrainOptions(iterations=iterations))


@pytest.fixture(scope="module")
def unlearning():
  """Unlearning rates of 40 training batches (seed 0) per cell."""
  return {label: train(label, 40)["final"] for label in
          ["grpo", "portool", "portool/omega1=0"]}


def test_grpo_unlearns_necessary_steps(unlearning):
  grpo = unlearning["grpo"]
  assert grpo["unlearning/num_necessary"] > 100
  assert grpo["unlearning/pooled_rate"] > 0.0 and grpo["unlearning/rate"] > 0.0
  assert grpo["unlearning/row_rate"] > 0.05


def test_portool_unlearns_far_less_than_grpo(unlearning):
  grpo, portool = unlearning["grpo"], unlearning["portool"]
  assert portool["unlearning/num_necessary"] > 100
  assert portool["unlearning/pooled_rate"] <= 0.5 * grpo["unlearning/pooled_rate"]
  assert portool["unlearning/row_rate"] <= 0.25 * grpo["unlearning/row_rate"]


def test_portool_without_trajectory_term_never_unlearns(unlearning):
  f = unlearning["portool/omega1=0"]
  assert f["unlearning/num_necessary"] > 100
  assert f["unlearning/pooled_rate"] == 0.0 and f["unlearning/row_rate"] == 0.0


def test_training_reaches_the_optimum_and_logs_a_consistent_curve():
  out = run_cell(TASK, parse_cell("dapo", ChainRolloutOptions(), TASK.max_steps), 0,
                 CreditTrainOptions(iterations=40, curve_every=1))
  curve, final = out["curve"], out["final"]
  assert len(curve["success"]) == 41 and curve["episodes"][0] == 0
  rows = ChainRolloutOptions().num_queries * ChainRolloutOptions().group_size
  assert np.all(np.diff(curve["episodes"]) == rows)
  assert curve["success"][0] < 0.2 and final["eval/success"] >= 0.9
  reached = final["episodes_to_threshold"]
  first = next(e for e, s in zip(curve["episodes"], curve["success"]) if s >= 0.9)
  assert reached == first and final["reached_threshold"] == 1.0
  assert final["episodes"] == 40 * rows
  sparse = train("dapo", 12)["curve"]["episodes"]  # every 5th evaluation and the last
  assert sparse == [0, 5 * rows, 10 * rows, 12 * rows]
  assert final["sampled_steps"] > final["episodes"]  # dropped tree candidates count too
  assert all(np.isfinite(v) for v in final.values() if v is not None)


def test_parse_cell():
  c = parse_cell("portool/omega1=0,shared_step_trj=own", ChainRolloutOptions(), 6)
  assert c.estimator == "portool" and c.rollouts.kind == "tree"
  opts = c.estimator_options()
  assert opts.omega1 == 0 and opts.shared_step_trj == "own"
  c = parse_cell("grpo/rollouts=independent,loss.aggregation=token_mean", ChainRolloutOptions(), 6)
  assert c.rollouts.kind == "independent" and c.loss == LossOptions(aggregation="token_mean")
  assert parse_cell("dapo", ChainRolloutOptions(), 6).loss.clip_high == 0.28
  dr = parse_cell("dr_grpo", ChainRolloutOptions(), 6).loss
  assert dr.aggregation == "seq_mean_token_sum_norm" and dr.norm_constant == 6.0
  assert parse_cell("grpo/loss.aggregation=seq_mean_token_sum_norm", ChainRolloutOptions(),
                    6).loss.norm_constant == 6.0


@pytest.mark.parametrize("label, match", [
    ("nope", "unknown advantage estimator"), ("portool/omegaX=1", "omegaX"),
    ("portool/omega1", "key=value"), ("grpo/rollouts=forest", "kind"),
    ("grpo/loss.bogus=1", "bogus"), ("grpo/loss.clip_low=2", "clip_low"),
    ("portool/omega1=0,omega1=1", "'omega1' is given twice")])
def test_parse_cell_rejects_bad_labels_by_name(label, match):
  with pytest.raises((ValueError, KeyError), match=match):
    parse_cell(label, ChainRolloutOptions(), 6)


def test_default_labels_cover_the_registry_and_the_ablations():
  labels = cells.default_labels()
  from tirjax import advantages
  from tirjax.advantages.critic import without_critics
  assert set(without_critics(advantages.names())) <= set(labels)
  assert {"portool/omega1=0", "portool/shared_step_trj=own"} <= set(labels)
  for label in labels:
    parse_cell(label, ChainRolloutOptions(), 6)


def test_seeds_and_label_lists():
  assert bench.parse_seeds("0-2,7") == [0, 1, 2, 7]
  assert bench.split_labels("grpo,portool/omega1=0,fork_scale=none,rloo") == [
      "grpo", "portool/omega1=0,fork_scale=none", "rloo"]
  for bad in ("", "1,1", "a"):
    with pytest.raises(ValueError, match="seeds"):
      bench.parse_seeds(bad)
  with pytest.raises(ValueError, match="before any estimator"):
    bench.split_labels("omega1=0,grpo")


@pytest.mark.parametrize("kwargs, name", [(dict(iterations=0), "iterations"),
                                          (dict(learning_rate=0.0), "learning_rate"),
                                          (dict(epochs=0), "epochs"),
                                          (dict(threshold=1.5), "threshold"),
                                          (dict(curve_every=0), "curve_every")])
def test_train_options_reject_bad_values_by_name(kwargs, name):
  with pytest.raises(ValueError, match=name):
    CreditTrainOptions(**kwargs)


def test_the_bench_writes_json_and_markdown_and_records_a_crash(tmp_path, monkeypatch):
  real = bench.run_cell

  def crash_on_rloo(task, cell, seed, opts):
    if cell.estimator == "rloo" and seed == 1:
      raise RuntimeError("boom")
    return real(task, cell, seed, opts)

  monkeypatch.setattr(bench, "run_cell", crash_on_rloo)
  path = tmp_path / "bench.json"
  _, table = bench.run(seeds="0-1", iterations=2, estimators="grpo,rloo", json_path=str(path),
                       command="the command")
  data = json.loads(path.read_text())
  assert data["command"] == "the command"
  assert data["machine"]["cpus"] >= 1 and data["task"]["num_stages"] == TASK.num_stages
  states = {(r["label"], r["seed"]): r["state"] for r in data["runs"]}
  assert states == {("grpo", 0): "finished", ("grpo", 1): "finished",
                    ("rloo", 0): "finished", ("rloo", 1): "failed"}
  markdown = (tmp_path / "bench.md").read_text()
  assert "| rloo | 2 | 1/2 ok; failed: seed 1 |" in markdown
  assert "RuntimeError: boom" in markdown
  study = reporting.load([str(path)])
  assert [r.label for r in study.runs] == ["grpo", "grpo", "rloo", "rloo"]
  assert table == markdown


def test_the_command_line_records_its_command_and_prints_the_table(tmp_path):
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  path = tmp_path / "cli.json"
  args = [f"--json={path}", "--seeds=0", "--estimators=grpo", "--iterations=2"]  # its order
  proc = subprocess.run([sys.executable, "-m", "experiments.studies.credit_bench", *args],
                        cwd=root, capture_output=True, text=True, timeout=600,
                        env={**os.environ, "PYTHONPATH": root, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 0, proc.stderr[-2000:]
  data = json.loads(path.read_text())
  assert data["command"] == "python -m experiments.studies.credit_bench " + " ".join(args)
  assert "Credit bench" in proc.stdout and (tmp_path / "cli.md").exists()
  bad = subprocess.run([sys.executable, "-m", "experiments.studies.credit_bench",
                        "--seeds=1,1"], cwd=root, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": root, "JAX_PLATFORMS": "cpu"})
  assert bad.returncode != 0 and "--seeds: need distinct seeds" in bad.stderr


def test_rewriting_the_markdown_keeps_the_hand_written_notes(tmp_path):
  path = str(tmp_path / "bench.md")
  bench.write_markdown(path, "# tables v1\n")
  notes = f"{bench.NOTES_MARKER}\n## Why\nan explanation\n"
  with open(path, "a") as f:
    f.write("\n" + notes)
  bench.write_markdown(path, "# tables v2\n")
  text = open(path).read()
  assert text.startswith("# tables v2\n") and "tables v1" not in text
  assert text.endswith(notes) and text.count(bench.NOTES_MARKER) == 1


def test_reuse_keeps_runs_of_the_same_cell_and_reruns_the_rest(tmp_path, monkeypatch):
  """--reuse: runs of an earlier file with the same cell, seed, task and training are kept
  (marked), a changed cell or a new seed runs, and a record without a loss option added since
  counts as its default."""
  first = tmp_path / "first.json"
  bench.run(seeds="0", iterations=2, estimators="grpo,rloo", json_path=str(first),
            command="python -m experiments.studies.credit_bench --seeds=0")
  old = json.loads(first.read_text())
  for run in old["runs"]:
    del run["loss"]["surrogate"]  # as written before the option existed
  first.write_text(json.dumps(old))
  ran = []
  real = bench.run_cell
  monkeypatch.setattr(bench, "run_cell",
                      lambda task, cell, seed, opts: ran.append((cell.label, seed)) or
                      real(task, cell, seed, opts))
  second = tmp_path / "second.json"
  bench.run(seeds="0-1", iterations=2, reuse=[str(first)], estimators="grpo,rloo/singleton=raw",
            json_path=str(second))
  data = json.loads(second.read_text())
  assert ran == [("grpo", 1), ("rloo/singleton=raw", 0), ("rloo/singleton=raw", 1)]
  kept = [r for r in data["runs"] if r.get("reused")]
  assert [(r["label"], r["seed"]) for r in kept] == [("grpo", 0)]
  assert kept[0]["final"] == old["runs"][0]["final"] and kept[0]["reused_from"] == str(first)
  assert [(r["from"], r["runs"]) for r in data["reused"]] == [(str(first), 1)]
  assert f"- 1 of the 4 runs from `{first}`: `python -m" in (tmp_path / "second.md").read_text()
  bench.run(seeds="0", iterations=3, reuse=[str(first)], estimators="grpo",
            json_path=str(tmp_path / "third.json"))  # other training options: nothing is kept
  assert ran[-1] == ("grpo", 0)
