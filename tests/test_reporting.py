"""Reports (tirjax.reporting, experiments.report) on synthetic run directories with known numbers,
checked against scipy.stats computed here."""

import csv
import io
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import scipy.stats
from hypothesis import given, strategies as st

from tirjax import reporting
from tirjax import rundir
from tirjax.reporting import runs as runs_lib
from tirjax.reporting import stats, tables

ACCURACY = {"grpo": [0.50, 0.60, 0.55], "portool": [0.62, 0.71, 0.60], "rloo": [0.40]}
RATE = {"grpo": 0.3, "portool": 0.05, "rloo": 0.2}


def rl_lines(label, seed, steps=8):
  """RL lines: reward/mean = seed + step / 10 (shifted per label); every third has no necessary
  step (rate 0, num_necessary 0: must be skipped); the others have RATE[label] + step / 100."""
  out = []
  for step in range(steps):
    none = step % 3 == 0
    out.append({"phase": "rl", "step": step, "time": float(step),
                "reward/mean": seed + step / 10 + (0.5 if label == "portool" else 0.0),
                "unlearning/rate": 0.0 if none else RATE[label] + step / 100,
                "unlearning/row_rate": 0.0 if none else 2 * RATE[label],
                "unlearning/num_necessary": 0 if none else 3})
  return out


def eval_line(step, accuracy):
  return {"phase": "eval", "step": step, "time": 1.0, "eval/accuracy": accuracy,
          "eval/avg_steps": 3.0 + accuracy, "eval/unanswerable_rate": 1 - accuracy,
          "eval/format_reward": 0.2}


def write_run(root, name, cell, status=None, lines=None, raw=None):
  d = os.path.join(root, name)
  os.makedirs(d)
  with open(os.path.join(d, "cell.json"), "w") as f:
    json.dump(cell, f)
  if status is not None:
    with open(os.path.join(d, "status.json"), "w") as f:
      json.dump(status, f)
  if lines is not None or raw is not None:
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
      f.write(raw if raw is not None else "".join(json.dumps(x) + "\n" for x in lines))
  return d


@pytest.fixture
def run_root(tmp_path):
  root = str(tmp_path / "runs")
  for label, accs in ACCURACY.items():
    for seed, acc in enumerate(accs):
      lines = ([{"phase": "sft", "step": 0, "time": 0.0, "loss": 1.0}] + rl_lines(label, seed)
               + [eval_line(3, acc - 0.2), eval_line(7, acc)])
      write_run(root, f"{label.replace('/', '_')}_{seed}",
                {"label": label, "estimator": label, "options": {}, "seed": seed},
                {"state": "finished", "error": None, "step": 7}, lines)
  bad = "portool/fork_scale=none"
  cell = lambda s: {"label": bad, "estimator": "portool", "options": {"fork_scale": "none"},
                    "seed": s}
  write_run(root, "bad_0", cell(0), {"state": "failed", "error": "OOM at step 3", "step": 3},
            rl_lines(bad.split("/")[0], 0, 3))
  write_run(root, "bad_1", cell(1), {"state": "running", "error": None, "step": 5},
            rl_lines("portool", 1, 5) + [eval_line(4, 0.3)])
  write_run(root, "bad_2", cell(2), {"state": "finished", "error": None, "step": 7})
  return root


def t_interval(values):
  x = np.asarray(values, float)
  return scipy.stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=scipy.stats.sem(x))


def test_final_metrics_of_a_run(run_root):
  run = runs_lib.load_run_dir(os.path.join(run_root, "grpo_1"))
  assert run.ok and run.label == "grpo" and run.seed == 1
  assert run.final["eval/accuracy"] == 0.60  # the last eval line
  assert run.final["eval/avg_steps"] == 3.60
  np.testing.assert_allclose(run.final["reward/mean"], 1 + np.mean([3, 4, 5, 6, 7]) / 10)
  counted = [s for s in range(8) if s % 3]  # lines with necessary steps
  np.testing.assert_allclose(run.final["unlearning/rate"], 0.3 + np.mean(counted) / 100)
  np.testing.assert_allclose(run.final["unlearning/row_rate"], 0.6)
  assert run.curves["eval/accuracy"] == ([3.0, 7.0], [pytest.approx(0.40), 0.60])
  assert run.curves["reward/mean"][0] == [float(s) for s in range(8)]


def test_table_means_and_intervals_match_scipy(run_root):
  study = reporting.load([run_root])
  rows = {r.label: r for r in tables.summarize(study)}
  for label in ("grpo", "portool"):
    iv = rows[label].metrics["eval/accuracy"]
    lo, hi = t_interval(ACCURACY[label])
    assert iv.n == 3 and rows[label].status == "ok"
    np.testing.assert_allclose([iv.mean, iv.low, iv.high], [np.mean(ACCURACY[label]), lo, hi],
                               rtol=1e-12)
    rewards = [s + 0.5 + (0.5 if label == "portool" else 0.0) for s in range(3)]
    lo, hi = t_interval(rewards)
    np.testing.assert_allclose([rows[label].metrics["reward/mean"].low,
                                rows[label].metrics["reward/mean"].high], [lo, hi], rtol=1e-12)
  single = rows["rloo"].metrics["eval/accuracy"]
  assert single.n == 1 and single.mean == 0.40 and single.low is None
  assert rows["grpo"].metrics["eval/solve_f1"].n == 0  # no run reports it


def test_paired_comparison_matches_scipy(run_root):
  study = reporting.load([run_root])
  paired = {(r.label, r.metric): r for r in tables.compare(study)}
  r = paired[("portool", "eval/accuracy")].result
  a, b = np.array(ACCURACY["portool"]), np.array(ACCURACY["grpo"])
  lo, hi = t_interval(a - b)
  assert r.n == 3
  np.testing.assert_allclose([r.diff.mean, r.diff.low, r.diff.high], [(a - b).mean(), lo, hi],
                             rtol=1e-12)
  np.testing.assert_allclose(r.p_value, scipy.stats.ttest_rel(a, b).pvalue, rtol=1e-12)
  # A constant difference (reward is shifted by 0.5 on every seed): p = 0, as scipy's.
  assert paired[("portool", "reward/mean")].result.p_value < 1e-12
  # rloo shares only seed 0 with grpo.
  assert paired[("rloo", "eval/accuracy")].result.n == 1
  assert paired[("portool/fork_scale=none", "eval/accuracy")].result is None


def test_missing_and_crashed_cells_are_shown(run_root, tmp_path):
  study = reporting.load([run_root])
  states = {r.seed: r.state for r in study.runs if r.label == "portool/fork_scale=none"}
  assert states == {0: "failed", 1: "running", 2: "no metrics"}
  rows = {r.label: r for r in tables.summarize(study)}
  bad = rows["portool/fork_scale=none"]
  assert bad.ok == 0 and bad.runs == 3
  assert bad.status == "0/3 ok; failed: seed 0; no metrics: seed 2; running: seed 1"
  md = reporting.render_markdown(study, "t")
  assert "| portool/fork_scale=none | 3 | 0/3 ok; failed: seed 0; no metrics: seed 2; " \
         "running: seed 1 | — |" in md
  assert "OOM at step 3" in md and "no finished run" in md
  paths = reporting.write_report(study, str(tmp_path / "out"))
  summary = list(csv.DictReader(io.StringIO(open(paths["summary.csv"]).read())))
  bad_rows = [r for r in summary if r["cell"] == "portool/fork_scale=none"]
  assert bad_rows and all(r["n"] == "0" and r["mean"] == "" for r in bad_rows)
  for key in ("curve:eval/accuracy", "curve:reward/mean"):
    with open(paths[key], "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_csv_holds_the_table_numbers(run_root, tmp_path):
  study = reporting.load([run_root])
  paths = reporting.write_report(study, str(tmp_path / "out"))
  summary = {(r["cell"], r["metric"]): r for r in csv.DictReader(open(paths["summary.csv"]))}
  row = summary[("grpo", "eval/accuracy")]
  lo, hi = t_interval(ACCURACY["grpo"])
  np.testing.assert_allclose([float(row["mean"]), float(row["ci_low"]), float(row["ci_high"])],
                             [np.mean(ACCURACY["grpo"]), lo, hi], rtol=1e-12)
  paired = {(r["cell"], r["metric"]): r for r in csv.DictReader(open(paths["paired.csv"]))}
  a, b = np.array(ACCURACY["portool"]), np.array(ACCURACY["grpo"])
  np.testing.assert_allclose(float(paired[("portool", "eval/accuracy")]["p_value"]),
                             scipy.stats.ttest_rel(a, b).pvalue, rtol=1e-12)


def test_metrics_file_problems(tmp_path):
  root = str(tmp_path)
  cell = {"label": "grpo", "estimator": "grpo", "options": {}, "seed": 0}
  ok = "".join(json.dumps(x) + "\n" for x in rl_lines("grpo", 0) + [eval_line(7, 0.5)])
  cut = write_run(root, "cut", cell, {"state": "finished", "error": None, "step": 7},
                  raw=ok + '{"phase": "rl", "st')  # killed mid-write: the last line is partial
  assert runs_lib.load_run_dir(cut).final["eval/accuracy"] == 0.5
  corrupt = write_run(root, "corrupt", cell, {"state": "finished", "error": None, "step": 7},
                      raw="{oops\n" + ok)
  run = runs_lib.load_run_dir(corrupt)
  assert run.state == "unreadable" and "line 1" in run.error and not run.ok
  no_status = write_run(root, "no_status", cell, None, rl_lines("grpo", 0) + [eval_line(7, .5)])
  assert runs_lib.load_run_dir(no_status).state == "unknown"
  with pytest.raises(FileNotFoundError, match="no run directory"):
    reporting.load([str(tmp_path / "empty_dir_that_is_missing")])


def test_run_dir_reads_each_file_of_a_run(tmp_path):
  lines = [{"phase": "sft", "step": 1}] + rl_lines("grpo", 0, 2) + [eval_line(2, 0.5)]
  files = rundir.RunDir(write_run(str(tmp_path), "run", {"label": "grpo", "seed": 0},
                                    {"state": "finished", "error": None, "step": 2}, lines))
  for name, obj in ((rundir.CONFIG, {"train": {"steps": 2}}),
                    (rundir.SUMMARY, {"after_rl": {"eval/accuracy": 0.5}}),
                    (rundir.EVAL_AFTER_SFT, {"eval/accuracy": 0.25})):
    with open(files.file(name), "w") as f:
      json.dump(obj, f)
  assert files.state() == "finished" and files.cell()["label"] == "grpo"
  assert files.config()["train"]["steps"] == 2
  assert files.summary()["after_rl"]["eval/accuracy"] == 0.5
  assert files.eval_after_sft()["eval/accuracy"] == 0.25
  assert files.metrics() == lines
  assert [x["step"] for x in files.metrics("rl")] == [0, 1]
  assert files.metrics("eval") == [eval_line(2, 0.5)]


def test_run_dir_state_is_none_until_a_status_can_be_read_and_other_files_raise(tmp_path):
  files = rundir.RunDir(str(tmp_path))
  assert files.state() is None
  with pytest.raises(FileNotFoundError, match="summary.json"):
    files.summary()
  with open(files.file(rundir.STATUS), "w") as f:
    f.write('{"state": "runn')  # a writer killed mid-write
  assert files.state() is None
  with pytest.raises(ValueError):
    files.status()


def test_bench_results_render_as_a_table():
  final = lambda s, e: {"eval/success": s, "episodes_to_threshold": e, "unlearning/rate": s / 10}
  data = {"runs": [
      {"label": "grpo", "seed": 0, "state": "finished", "final": final(0.9, 1000),
       "curve": {"episodes": [0, 128], "success": [0.1, 0.9], "mean_outcome": [-0.5, 0.8]}},
      {"label": "grpo", "seed": 1, "state": "finished", "final": final(0.7, None),
       "curve": {"episodes": [0, 128], "success": [0.1, 0.7], "mean_outcome": [-0.5, 0.6]}},
      {"label": "portool", "seed": 0, "state": "finished", "final": final(1.0, 500)},
      {"label": "portool", "seed": 1, "state": "failed", "error": "boom", "final": {}}]}
  study = reporting.bench_study(data)
  rows = {r.label: r for r in tables.summarize(study)}
  lo, hi = t_interval([0.9, 0.7])
  iv = rows["grpo"].metrics["eval/success"]
  np.testing.assert_allclose([iv.mean, iv.low, iv.high], [0.8, lo, hi], rtol=1e-12)
  assert rows["grpo"].metrics["episodes_to_threshold"].n == 1  # one seed never reached it
  assert rows["portool"].status == "1/2 ok; failed: seed 1"
  md = reporting.render_markdown(study)
  assert f"| grpo | 2 | ok | 0.800 ± {(hi - lo) / 2:.3f} (n=2) | 1000 (n=1) |" in md


def _report(*args):
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  return subprocess.run([sys.executable, "-m", "experiments.report", *args], cwd=root,
                        capture_output=True, text=True, timeout=600,
                        env={**os.environ, "PYTHONPATH": root, "JAX_PLATFORMS": "cpu"})


def test_command_line(run_root, tmp_path):
  out = str(tmp_path / "report")
  proc = _report(run_root, f"--out={out}", "--last_rl=2")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert sorted(os.listdir(out)) == ["curve_eval_accuracy.png", "curve_reward_mean.png",
                                     "paired.csv", "report.md", "summary.csv"]
  assert "Paired comparison against `grpo`" in proc.stdout
  bad = _report(run_root, f"--out={tmp_path / 'other'}", "--last_rl=0")
  assert bad.returncode != 0 and "last_rl" in bad.stderr
  assert not os.path.exists(tmp_path / "other")


finite = st.floats(-1e3, 1e3, allow_nan=False)


@given(st.lists(finite, min_size=2, max_size=20))
def test_mean_ci_matches_scipy(values):
  iv = stats.mean_ci(values)
  x = np.asarray(values)
  assert iv.n == len(values) and math.isclose(iv.mean, x.mean(), rel_tol=1e-9, abs_tol=1e-9)
  if np.ptp(x) > 1e-6:
    lo, hi = t_interval(x)
    np.testing.assert_allclose([iv.low, iv.high], [lo, hi], rtol=1e-7, atol=1e-7)
  else:
    assert iv.high - iv.low <= 1e-5


@given(st.lists(st.tuples(finite, finite), min_size=2, max_size=20))
def test_paired_matches_scipy(pairs):
  a, b = map(np.asarray, zip(*pairs))
  p = stats.paired(a, b)
  assert p.n == len(pairs)
  if np.ptp(a - b) > 1e-6:
    np.testing.assert_allclose(p.p_value, scipy.stats.ttest_rel(a, b).pvalue, rtol=1e-6)
    assert 0.0 <= p.p_value <= 1.0
  elif np.all(a - b == 0):
    assert p.p_value is None
  elif np.ptp(a - b) == 0:
    assert p.p_value == 0.0


def test_degenerate_statistics():
  assert stats.mean_ci([]) == stats.Interval(0, None, None, None)
  assert stats.mean_ci([2.0]) == stats.Interval(1, 2.0, None, None)
  assert stats.mean_ci([1.0, 1.0]) == stats.Interval(2, 1.0, 1.0, 1.0)
  with pytest.raises(ValueError, match="level"):
    stats.mean_ci([1.0, 2.0], level=1.0)
  with pytest.raises(ValueError, match="finite"):
    stats.mean_ci([1.0, float("nan")])
  with pytest.raises(ValueError, match="one length"):
    stats.paired([1.0], [1.0, 2.0])
  assert stats.paired([1.0, 2.0], [1.0, 2.0]).p_value is None
  assert stats.paired([1.5, 2.5], [1.0, 2.0]).p_value == 0.0
  assert stats.paired([1.0], [0.0]).p_value is None


def test_detectable_difference_and_seeds_needed():
  from tirjax.reporting import stats
  # (t_{0.975,2} + t_{0.8,2}) / sqrt(3) = (4.3027 + 1.0607) / 1.7321
  assert stats.detectable_difference(1.0, 3) == pytest.approx(3.0966, abs=1e-3)
  assert stats.detectable_difference(0.5, 3) == pytest.approx(3.0966 / 2, abs=1e-3)
  assert stats.detectable_difference(1.0, 1) is None
  sizes = [stats.detectable_difference(1.0, n) for n in range(2, 30)]
  assert all(a > b for a, b in zip(sizes, sizes[1:]))
  n = stats.seeds_needed(0.03, 0.02)
  assert stats.detectable_difference(0.03, n) <= 0.02 < stats.detectable_difference(0.03, n - 1)
  # A simulated paired t-test at that size rejects about `power` of the time.
  rng = np.random.default_rng(0)
  d = rng.normal(0.02, 0.03, size=(4000, n))
  t = d.mean(1) / (d.std(1, ddof=1) / np.sqrt(n))
  import scipy.stats
  rejected = np.mean(np.abs(t) > scipy.stats.t.ppf(0.975, n - 1))
  assert 0.75 < rejected < 0.88


def test_gain_is_last_minus_first_eval():
  from tirjax.reporting.runs import final_metrics
  lines = [{"phase": "eval", "step": 0, "eval/accuracy": 0.25},
           {"phase": "rl", "step": 1, "reward/mean": 0.1},
           {"phase": "eval", "step": 1, "eval/accuracy": 0.4}]
  assert final_metrics(lines)["gain/accuracy"] == pytest.approx(0.15)
  assert "gain/accuracy" not in final_metrics(lines[:1])


def _study(labels, points, seeds=3):
  rng = np.random.default_rng(0)
  runs = [runs_lib.Run(label, s, "finished", final={"x": 1.0},
                       curves={"c": (list(range(points)), list(rng.random(points)))})
          for label in labels for s in range(seeds)]
  return runs_lib.Study(runs, (), ("c",), "step", baseline=labels[0])


def test_plots_are_readable_at_a_glance():
  from tirjax.reporting import plots
  few = [f"cell{i}" for i in range(4)]
  many = [f"cell{i}" for i in range(12)]
  # Few cells, long series: one panel, a line per cell, each its own colour, no markers.
  ax, = plots.figure(_study(few, 40), "c").axes
  lines = [ln for ln in ax.get_lines() if ln.get_label().startswith("cell")]
  assert len(lines) == 4 and len({ln.get_color() for ln in lines}) == 4
  assert all(ln.get_marker() in ("None", None, "") for ln in lines)
  # Short series get markers (a one-point-per-run series must be visible).
  ax, = plots.figure(_study(few, 3), "c").axes
  assert all(ln.get_marker() == "o" for ln in ax.get_lines() if ln.get_label().startswith("cell"))
  # Many cells: small multiples, one panel per non-baseline cell, each with the baseline in grey.
  fig = plots.figure(_study(many, 40), "c")
  panels = [a for a in fig.axes if a.get_visible() and a.axison]
  assert len(panels) == 11
  for a in panels:
    colors = [ln.get_color() for ln in a.get_lines()]
    assert plots.BASELINE_COLOR in colors and len(set(colors)) == 2
  assert len({a.get_lines()[-1].get_color() for a in panels}) == 11  # every cell its colour
  # A single point per cell: a point-range chart with a column per cell.
  ax, = plots.figure(_study(many, 1), "c").axes
  assert [t.get_text().split("\n")[0] for t in ax.get_xticklabels()] == many
  assert plots.figure(_study(few, 3), "missing") is None


def test_a_cell_keeps_its_colour_in_every_figure_of_a_study():
  # The report's warm start has eval curves but no training reward: without it in a figure,
  # the other cells must not shift to its colour.
  from tirjax.reporting import plots
  labels = ["sft", "grpo", "hidifftir"]
  runs = [runs_lib.Run(label, s, "finished", final={"x": 1.0},
                       curves={"eval": ([0, 10, 20], [0.1, 0.2, 0.3]),
                               **({} if label == "sft" else {"reward": ([1, 2, 3], [0., 1., 0.])})})
          for label in labels for s in range(2)]
  study = runs_lib.Study(runs, (), ("eval", "reward"), "step", baseline="grpo")

  def colours(name):
    ax, = plots.figure(study, name).axes
    return {ln.get_label().split(" ")[0]: ln.get_color() for ln in ax.get_lines()
            if ln.get_label().split(" ")[0] in labels}

  on_eval, on_reward = colours("eval"), colours("reward")
  assert set(on_reward) == {"grpo", "hidifftir"}
  assert all(on_reward[k] == on_eval[k] for k in on_reward)
