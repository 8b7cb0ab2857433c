"""Ablation grids without training: labels, checks before any compute, warm-start groups,
run-directory preparation (skip / resume decisions) and the scheduler, with a stand-in
command in place of the trainer."""

import dataclasses
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import ml_collections
import pytest

from configs import ablate as ablate_config
from configs import cell as cell_config
from configs import grpo as grpo_config
from tirjax import ablation, rundir
from tirjax.ablation import runner


def _default_sigint():
  """pytest-xdist workers ignore SIGINT and children inherit that: restore Python's default."""
  signal.signal(signal.SIGINT, signal.SIG_DFL)


def smoke(**changes):
  """The smoke grid of configs/ablate.py with some entries replaced."""
  grid = ablate_config.get_config("grid=smoke")
  with grid.unlocked():
    for key, value in changes.items():
      grid[key] = value
  return grid


def test_labels_read_options_and_dotted_keys():
  sections = {"rollout", "loss", "advantage"}
  name, options, overrides = ablation.parse_label(
      "portool/fork_scale=none,omega1=0,rollout.mode=independent,zscore.ddof=0,loss.x=0.5",
      sections)
  assert name == "portool"
  assert options == {"fork_scale": "none", "omega1": 0, "rollout.mode": "independent",
                     "zscore.ddof": 0, "loss.x": 0.5}
  assert overrides == [("advantage.options.fork_scale", "none"), ("advantage.options.omega1", 0),
                       ("rollout.mode", "independent"), ("advantage.options.zscore.ddof", 0),
                       ("loss.x", 0.5)]
  assert ablation.parse_label("grpo", sections) == ("grpo", {}, [])
  assert ablation.parse_label("hidifftir/turn_difficulty=false", sections)[1] == {
      "turn_difficulty": False}
  with pytest.raises(ablation.GridError, match="key=value"):
    ablation.parse_label("portool/fork_scale", sections)
  with pytest.raises(ablation.GridError, match="'omega1' is given twice"):
    ablation.parse_label("portool/omega1=0,omega1=1", sections)


def test_default_grid_plans_every_cell_with_its_options(tmp_path):
  workdir = str(tmp_path / "grid")
  jobs = ablation.plan(ablate_config.get_config(), workdir)
  assert not os.path.exists(workdir)  # planning writes nothing
  cells = ablate_config.GRIDS["all"]
  warm = sorted({j.label for j in jobs if j.estimator == "sft"})
  assert len(warm) == 2  # response_gen and answer_tag cells cannot share SFT demonstrations
  assert len(jobs) == 3 * (len(cells) + len(warm))
  assert [j.label for j in jobs if j.seed == 1 and j.estimator != "sft"] == list(cells)
  configs = {(j.label, j.seed): ablation.build_config(j.recipe) for j in jobs}
  tiny_sft_steps = grpo_config.get_config().sft.steps  # the tiny preset's warm start
  c = configs[("portool/fork_scale=none", 2)]
  assert (c.advantage.name, c.advantage.options.fork_scale, c.seed) == ("portool", "none", 2)
  assert c.advantage.options.tree_aggregation == "adaptive"
  assert configs[("portool/rollout.mode=independent", 0)].rollout.mode == "independent"
  assert configs[("portool", 0)].rollout.mode == "tree"
  assert configs[("hidifftir/trajectory_difficulty=false", 0)].advantage.options \
      .trajectory_difficulty is False
  assert configs[("matchtir_km/matching=greedy", 0)].advantage.options.matching == "greedy"
  for job in jobs:
    c = configs[(job.label, job.seed)]
    assert c.train.progress_bar is False
    if job.estimator == "sft":
      assert (c.train.steps, c.sft.steps, c.train.export_final) == (0, tiny_sft_steps, True)
      continue
    warm_label = os.path.relpath(job.needs, workdir).split(os.sep)[0]
    assert job.needs == os.path.join(workdir, warm_label, f"seed{job.seed}")
    assert c.model.hf_checkpoint == os.path.join(os.path.abspath(job.needs), "hf_export")
    assert (c.sft.steps, c.train.steps) == (0, grpo_config.get_config().train.steps)
    assert c.rollout.answer_protocol == configs[(warm_label, job.seed)].rollout.answer_protocol


def test_the_staleness_grid_differs_only_in_k_within_an_estimator(tmp_path):
  """`grid=staleness`: grpo and hidifftir at k = 0, 1, 2, one warm start per seed, and every
  cell's config resolves with the token-level correction; within an estimator the configs
  differ in `train.max_staleness` alone."""
  from tirjax.trainer import resolve  # pylint: disable=import-outside-toplevel
  workdir = str(tmp_path / "grid")
  jobs = ablation.plan(ablate_config.get_config("grid=staleness,seeds=1"), workdir)
  assert len({j.label for j in jobs if j.estimator == "sft"}) == 1
  configs = {j.label: ablation.build_config(j.recipe) for j in jobs if j.estimator != "sft"}
  assert len(configs) == 6
  ks = {}
  for label, c in configs.items():
    checked = ml_collections.ConfigDict(c.to_dict())
    checked.model.hf_checkpoint = ""  # the warm start's export, not made by planning
    exp = resolve.resolve(checked)
    assert exp.loss.rollout_correction.is_level == "token"
    ks.setdefault(c.advantage.name, {})[exp.train.max_staleness] = _flat(c)
  assert sorted(ks) == ["grpo", "hidifftir"]
  for by_k in ks.values():
    assert sorted(by_k) == [0, 1, 2]
    for k in (1, 2):
      differ = {key for key in by_k[0] if by_k[0][key] != by_k[k].get(key)}
      assert differ == {"train.max_staleness"}


@pytest.mark.parametrize("grid", ["credit", "credit12"])
def test_a_credit_grid_keeps_the_warm_start_label_its_committed_results_name(tmp_path, grid):
  """Keys added since (at their defaults) leave a warm start's label as it was, so a grid's
  committed results keep naming its warm starts and a grid that shares them finds them
  (`grid=credit12` starts from `grid=credit`'s, copied into its workdir)."""
  import re  # pylint: disable=import-outside-toplevel
  folder = pathlib.Path(__file__).parent.parent / "benchmarks" / "results" / f"ablation_{grid}"
  named = {m for f in folder.rglob("*") if f.is_file()
           for m in re.findall(r"sft-[0-9a-f]{8}", f.read_text(errors="ignore"))}
  jobs = ablation.plan(ablate_config.get_config(f"grid={grid},seeds=1"), str(tmp_path / "g"))
  assert named and {j.label for j in jobs if j.estimator == "sft"} == named


def test_grid_config_is_locked_and_checks_its_argument():
  grid = ablate_config.get_config("grid=portool,seeds=5,model=tiny,steps=7")
  assert grid.seeds == (0, 1, 2, 3, 4) and grid.preset == "model=tiny,steps=7"
  assert grid.cells == ablate_config.PORTOOL
  with pytest.raises(AttributeError):
    grid.cellz = ("grpo",)
  with pytest.raises(ValueError, match="seeds=0"):
    ablate_config.get_config("seeds=0")
  with pytest.raises(ValueError, match="unknown preset key 'rollout'"):
    ablate_config.get_config("rollout=tree")


@pytest.mark.parametrize("changes, match", [
    (dict(cells=("grpo", "nosuch/alpha=1")), r"cells\[1\] 'nosuch/alpha=1': unknown estimator "
     "'nosuch'"),
    (dict(cells=("portool/no_such_option=1",)), r"cells\[0\] 'portool/no_such_option=1': unknown "
     r"config key 'advantage.options.no_such_option'"),
    (dict(cells=("grpo", "grpo/rollout.nn=3")), r"cells\[1\] 'grpo/rollout.nn=3': unknown config "
     "key 'rollout.nn'"),
    (dict(cells=("portool/fork_scale=sideways",)), r"cells\[0\] 'portool/fork_scale=sideways': "
     "advantage.options: fork_scale"),
    (dict(cells=("portool/omega1=abc",)), r"cells\[0\] 'portool/omega1=abc': "
     r"advantage.options.omega1='abc'"),
    (dict(cells=("grpo", "portool", "grpo")), r"cells\[2\] 'grpo': the same label as cells\[0\]"),
    (dict(cells=("grpo/seed=3",)), r"cells\[0\] 'grpo/seed=3': seeds are set by the grid"),
    (dict(cells=("portool/x=../../etc",)), r"cells\[0\] 'portool/x=../../etc': the label"),
    (dict(cells=()), "cells: the grid has no cells"),
    (dict(seeds=(0, 0)), r"seeds: \[0, 0\] repeats"),
    (dict(seeds=(-1,)), "seeds: need"),
])
def test_bad_grid_entries_fail_before_anything_is_written(tmp_path, changes, match):
  workdir = str(tmp_path / "grid")
  with pytest.raises(ablation.GridError, match=match):
    ablation.plan(smoke(**changes), workdir)
  assert not os.path.exists(workdir)


def test_bad_shared_overrides_and_config_files_name_their_entry(tmp_path):
  grid = smoke()
  with grid.unlocked():
    grid.overrides.train.stepz = 3
  with pytest.raises(ablation.GridError, match=r"overrides.train.stepz \(in cells\[0\] 'grpo'\)"):
    ablation.plan(grid, str(tmp_path))
  grid = smoke()
  with grid.unlocked():
    grid.configs.portool = "configs/grpo.py"
  with pytest.raises(ablation.GridError, match=r"cells\[1\] 'portool': config file .*grpo.py "
                     "builds estimator 'grpo'"):
    ablation.plan(grid, str(tmp_path))
  grid = smoke()
  with grid.unlocked():
    grid.configs.nosuch = "configs/grpo.py"
  with pytest.raises(ablation.GridError, match="configs.nosuch: unknown estimator"):
    ablation.plan(grid, str(tmp_path))


def test_a_cell_that_changes_sft_gets_its_own_warm_start_and_one_with_none_skips_it(tmp_path):
  jobs = ablation.plan(smoke(cells=("grpo", "portool", "grpo/sft.num_demos=4",
                                    "portool/sft.steps=0"), seeds=(3,)), str(tmp_path))
  warm = [j.label for j in jobs if j.estimator == "sft"]
  assert len(warm) == 2
  needs = {j.label: j.needs for j in jobs if j.estimator != "sft"}
  assert needs["grpo"] == needs["portool"] != needs["grpo/sft.num_demos=4"]
  assert needs["portool/sft.steps=0"] is None
  c = ablation.build_config([j for j in jobs if j.label == "portool/sft.steps=0"][0].recipe)
  assert (c.model.hf_checkpoint, c.sft.steps, c.seed) == ("", 0, 3)
  without = ablation.plan(smoke(warm_start="none"), str(tmp_path))
  assert [j.label for j in without] == ["grpo", "portool", "grpo", "portool"]
  assert ablation.build_config(without[0].recipe).sft.steps == 2


def test_rl_overrides_reach_the_rl_cells_and_leave_the_warm_starts_as_they_were(tmp_path):
  """grid=credit12 starts from grid=credit's warm starts: its RL keys must not enter theirs."""
  from tirjax.trainer import resolve
  plain = ablation.plan(smoke(), str(tmp_path))
  design = ablation.plan(smoke(rl_overrides=ml_collections.ConfigDict(
      dict(rollout=dict(n=4), train=dict(queries_per_step=2)))), str(tmp_path))
  record = lambda job: resolve.config_record(ablation.build_config(job.recipe))
  for a, b in zip(plain, design):
    assert (a.label, a.workdir, a.needs) == (b.label, b.workdir, b.needs)
    if a.estimator == "sft":
      assert record(a) == record(b)
    else:
      c = ablation.build_config(b.recipe)
      assert (c.rollout.n, c.train.queries_per_step) == (4, 2)
  for bad in (dict(sft=dict(steps=3)), dict(model=dict(hf_checkpoint="x")), dict(seed=1)):
    with pytest.raises(ablation.GridError, match=r"rl_overrides\..*decides the warm start"):
      ablation.plan(smoke(rl_overrides=ml_collections.ConfigDict(bad)), str(tmp_path))


def test_a_shared_warm_start_runs_sft_once_for_every_seed(tmp_path):
  jobs = ablation.plan(smoke(warm_start="shared", seeds=(4, 1, 2)), str(tmp_path))
  warm = [j for j in jobs if j.estimator == "sft"]
  assert [(j.seed, j.workdir) for j in warm] == [(4, str(tmp_path / warm[0].label / "seed4"))]
  cells = [j for j in jobs if j.estimator != "sft"]
  assert sorted(j.seed for j in cells) == [1, 1, 2, 2, 4, 4]
  assert {j.needs for j in cells} == {warm[0].workdir}
  for j in cells:
    c = ablation.build_config(j.recipe)
    assert c.model.hf_checkpoint == os.path.join(warm[0].workdir, "hf_export") and c.seed == j.seed
  with pytest.raises(ablation.GridError, match="warm_start: must be one of"):
    ablation.plan(smoke(warm_start="per_cell"), str(tmp_path))


def test_the_cell_config_file_rebuilds_a_prepared_run(tmp_path):
  jobs = ablation.plan(smoke(), str(tmp_path))
  assert all(ablation.prepare(jobs))
  job = jobs[2]
  with open(os.path.join(job.workdir, "cell.json")) as f:
    cell = json.load(f)
  assert {k: cell[k] for k in ("label", "estimator", "options", "seed")} == {
      "label": "portool", "estimator": "portool", "options": {}, "seed": 0}
  assert ablation.Recipe.from_json(cell["recipe"]) == job.recipe
  assert cell_config.get_config(job.workdir).to_dict() == \
      ablation.build_config(job.recipe).to_dict()
  with open(os.path.join(job.workdir, "config.json")) as f:
    assert rundir.flatten(json.load(f))["advantage.name"] == "portool"
  with pytest.raises(ValueError, match="run directory"):
    cell_config.get_config(None)


def test_prepare_skips_finished_runs_unless_their_steps_changed(tmp_path):
  jobs = ablation.plan(smoke(), str(tmp_path))
  assert ablation.prepare(jobs) == [True] * 6
  for job, state in zip(jobs, ["finished", "finished", "failed", "running", "finished",
                               "finished"]):
    rundir.write_status(job.workdir, state, 2)
  assert ablation.prepare(jobs) == [False, False, True, True, False, False]
  more = ablation.plan(smoke(preset="steps=5"), str(tmp_path))
  assert ablation.prepare(more) == [False, True, True, True, True, True]  # warm starts: 0 steps
  other = ablation.plan(smoke(cells=("grpo", "portool/fork_scale=none")), str(tmp_path))
  assert ablation.prepare(other)[2]  # a new cell: a new directory
  changed = ablation.plan(smoke(cells=("grpo/loss.clip_low=0.1", "portool")), str(tmp_path))
  changed = [j if j.label != "grpo/loss.clip_low=0.1" else
             dataclasses.replace(j, workdir=str(tmp_path / "grpo" / f"seed{j.seed}"))
             for j in changed]
  with pytest.raises(ablation.GridError, match=r"grpo/loss.clip_low=0.1 seed0: .*loss.clip_low: "
                     "0.2 -> 0.1"):
    ablation.prepare(changed)


STAND_IN = """
import json, os, sys, time
d = sys.argv[1]
fail = os.sep + 'sft-' in d and d.endswith('seed0')
with open(os.path.join(d, 'status.json'), 'w') as f:
  json.dump({'state': 'failed' if fail else 'finished', 'step': 0, 'error': 'boom' if fail
             else None}, f)
time.sleep(0.3)
sys.exit(3 if fail else 0)
"""


@pytest.mark.parametrize("parallel", [1, 3])
def test_runs_wait_for_their_warm_start_and_skip_a_failed_one(tmp_path, capsys, parallel):
  workdir = str(tmp_path / "grid")
  jobs = ablation.plan(smoke(), workdir)
  started = []

  def command(job):
    started.append(job.name)
    return [sys.executable, "-c", STAND_IN, job.workdir]

  results = ablation.run_grid(jobs, workdir, command, parallel=parallel, compilation_cache=False)
  assert [(r.job.name, r.state) for r in results] == [
      (jobs[0].name, "failed"), ("grpo seed0", "blocked"), ("portool seed0", "blocked"),
      (jobs[3].name, "finished"), ("grpo seed1", "finished"), ("portool seed1", "finished")]
  assert results[0].error == "boom"
  assert sorted(started) == sorted(jobs[i].name for i in (0, 3, 4, 5))
  assert started.index("grpo seed1") > started.index(jobs[3].name)
  assert not os.path.exists(os.path.join(jobs[1].workdir, "train.log"))
  out = capsys.readouterr().out
  assert f"6 runs (2 warm starts), 0 finished earlier, 6 to run, {parallel} at a time" in out
  # Which of the two warm starts ends first is up to the scheduler when they run side by side.
  assert re.search(rf"\[\d/6\] {re.escape(jobs[0].name)}: failed in", out) and ": boom (see" in out
  assert re.search(rf"\[\d/6\] grpo seed0: not run: its warm start {re.escape(jobs[0].workdir)} "
                   "did not finish", out)
  # [k/n] counts the jobs ended so far: 1, 2, ..., 6 over the lines that end a job.
  ended = [int(m[1]) for m in re.finditer(r"^\[(\d)/6\] .*?: (?:finished in|failed in|not run)",
                                          out, re.M)]
  assert ended == [1, 2, 3, 4, 5, 6]
  rerun = ablation.run_grid(jobs, workdir, command, parallel=parallel, compilation_cache=False)
  assert [r.state for r in rerun] == ["failed", "blocked", "blocked", "skipped", "skipped",
                                      "skipped"]
  assert "(was failed)" in capsys.readouterr().out


def test_a_run_killed_without_status_is_failed_and_one_grid_runs_at_a_time(tmp_path):
  workdir = str(tmp_path / "grid")
  jobs = ablation.plan(smoke(cells=("grpo",), seeds=(0,)), workdir)[1:]
  jobs = [dataclasses.replace(j, needs=None) for j in jobs]
  results = ablation.run_grid(jobs, workdir, lambda job: [sys.executable, "-c", "exit(9)"],
                              compilation_cache=False)
  assert results[0].state == "failed" and results[0].error == "exit code 9, status None"
  lock = runner._Lock(workdir)
  try:
    with pytest.raises(ablation.GridError, match="another experiments.ablate"):
      ablation.run_grid(jobs, workdir, lambda job: ["true"])
  finally:
    lock.close()


def test_run_processes_share_a_compilation_cache_and_split_gpu_memory(tmp_path, monkeypatch):
  for name in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
               "XLA_PYTHON_CLIENT_MEM_FRACTION"):
    monkeypatch.delenv(name, raising=False)
  env = runner.child_env(str(tmp_path), parallel=3, compilation_cache=True)
  assert env["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "jax_cache")
  assert env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"
  assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.300"
  env = runner.child_env(str(tmp_path), parallel=1, compilation_cache=False)
  assert "JAX_COMPILATION_CACHE_DIR" not in env and "XLA_PYTHON_CLIENT_MEM_FRACTION" not in env
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/elsewhere")
  assert runner.child_env(str(tmp_path), 1, True)["JAX_COMPILATION_CACHE_DIR"] == "/elsewhere"


HARNESS = """
import sys
from configs import ablate
from tirjax import ablation
grid = ablate.get_config("grid=smoke")
with grid.unlocked():
  grid.cells, grid.seeds, grid.warm_start = ("grpo",), (0,), "none"
jobs = ablation.plan(grid, sys.argv[1])
ablation.run_grid(jobs, sys.argv[1], lambda job: [sys.executable, "-c", sys.argv[2], job.workdir],
                  compilation_cache=False)
"""
SLOW_RUN = """
import json, os, sys, time
def status(state, error=None):
  with open(os.path.join(sys.argv[1], 'status.json'), 'w') as f:
    json.dump({'state': state, 'step': 0, 'error': error}, f)
status('running')
try:
  time.sleep(120)
except KeyboardInterrupt:
  status('failed', 'KeyboardInterrupt')
  sys.exit(1)
"""


def test_ctrl_c_interrupts_the_runs_which_record_it(tmp_path):
  workdir = str(tmp_path / "grid")
  status = os.path.join(workdir, "grpo", "seed0", "status.json")
  harness = subprocess.Popen(preexec_fn=_default_sigint, args=[sys.executable, "-c", HARNESS, workdir, SLOW_RUN],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.monotonic() + 120
    while runner.run_state(os.path.dirname(status)) != "running":
      assert harness.poll() is None and time.monotonic() < deadline, harness.communicate()
      time.sleep(0.1)
    harness.send_signal(signal.SIGINT)
    _, err = harness.communicate(timeout=180)
  finally:
    if harness.poll() is None:
      harness.kill()
  assert harness.returncode != 0 and "KeyboardInterrupt" in err
  with open(status) as f:
    assert json.load(f) == {"state": "failed", "step": 0, "error": "KeyboardInterrupt"}


def test_an_estimator_can_take_another_config_file_and_argument(tmp_path):
  path = tmp_path / "my_portool.py"
  path.write_text("from configs import portool\n\n\ndef get_config(arg=None):\n"
                  "  c = portool.get_config(arg)\n  c.advantage.options.gamma = 0.5\n  return c\n")
  grid = smoke()
  with grid.unlocked():
    grid.configs.portool = f"{path}:model=tiny,steps=4"
  jobs = ablation.plan(grid, str(tmp_path / "grid"))
  portool, grpo = (ablation.build_config(j.recipe) for j in jobs[2:0:-1])
  assert (portool.advantage.options.gamma, portool.train.steps) == (0.5, 4)
  assert (grpo.train.steps, portool.env.eval_tasks) == (2, 4)  # the grid's preset and overrides


def test_a_run_whose_warm_start_is_not_in_the_jobs_is_not_run(tmp_path, capsys):
  workdir = str(tmp_path / "grid")
  jobs = ablation.plan(smoke(cells=("grpo",), seeds=(0,)), workdir)[1:]
  results = ablation.run_grid(jobs, workdir, lambda job: ["false"], compilation_cache=False)
  assert [(r.state, r.error) for r in results] == [
      ("blocked", f"warm start {jobs[0].needs} is not in the grid")]
  assert "not run: its warm start" in capsys.readouterr().out


def _flat(config):
  return rundir.flatten(config.to_dict())


def test_the_default_grid_runs_every_cell_on_make_runs_design(tmp_path):
  """grid=default compares estimators on `make run`'s config: each RL cell's config is the
  default's (configs/hidifftir.py) except for the estimator, PORTool's tree rollouts and what a
  start from the seed's one warm start changes."""
  from configs import hidifftir as default_config
  jobs = ablation.plan(ablate_config.get_config("grid=default"), str(tmp_path))
  warm = [j for j in jobs if j.estimator == "sft"]
  assert sorted(j.seed for j in warm) == [0, 1, 2] and len({j.label for j in warm}) == 1
  default = _flat(default_config.get_config("model=tiny"))
  from_warm_start = {"model.hf_checkpoint", "sft.steps", "sft.optim.decay_steps"}
  cells = [j for j in jobs if j.estimator != "sft"]
  assert sorted({j.label for j in cells}) == ["grpo", "hidifftir", "portool"]
  for job in cells:
    c = _flat(ablation.build_config(job.recipe))
    differ = {k for k in default.keys() | c.keys() if default.get(k, None) != c.get(k, None)}
    differ -= from_warm_start | {"seed", "train.progress_bar"}
    differ = {k for k in differ if not k.startswith("advantage.")}
    assert differ == ({"rollout.mode"} if job.label == "portool" else set()), job.label
    assert c["seed"] == job.seed and c["advantage.name"] == job.label
  c = _flat(ablation.build_config(warm[0].recipe))
  assert (c["sft.steps"], c["train.steps"]) == (default["sft.steps"], 0)


def test_the_oracle_grids_add_the_control_and_leave_the_other_runs_as_they_were(tmp_path):
  """grid=credit12_oracle (spec §4.4: the oracle, a positive control): the credit12 grid's
  runs, recipe for recipe (run in that grid's workdir, they are skipped as finished), plus the
  oracle's, from the same warm start and on the grpo cell's config but for the estimator."""
  from tirjax.trainer import resolve
  base = ablation.plan(ablate_config.get_config("grid=credit12,seeds=1"), str(tmp_path))
  more = ablation.plan(ablate_config.get_config("grid=credit12_oracle,seeds=1"), str(tmp_path))
  assert [j for j in more if j.label != "oracle"] == base
  [oracle] = [j for j in more if j.label == "oracle"]
  [grpo] = [j for j in base if j.label == "grpo"]
  assert oracle.needs == grpo.needs is not None
  record = lambda job: resolve.config_record(ablation.build_config(job.recipe))
  a, b = record(oracle), record(grpo)
  assert a["advantage"]["name"] == "oracle" and b["advantage"]["name"] == "grpo"
  assert {k: v for k, v in a.items() if k != "advantage"} == {
      k: v for k, v in b.items() if k != "advantage"}


@pytest.mark.parametrize("k,cells", [(4, ["grpo", "hidifftir/rollout.strict_directions=true",
                                           "oracle", "portool"]),
                                     (2, ["grpo", "oracle"])])
def test_the_knockout_grids_are_the_signal_limited_testbed(tmp_path, tokenizer, k, cells):
  """grid=credit_k<K> (issue 51): the knockout chains at K directions with no unanswerable
  task, 5 seeds, curves of at least 8 greedy evaluations on a fixed subset of at least 128
  eval tasks, groups of 12; every cell of a seed starts from the seed's one warm start, and
  the oracle's config is grpo's but for the estimator. The shapes hold drawn tasks: the steps
  and the answer, the widest step, every ground-truth call, and a row holds their confused
  demonstrations (what the warm start's SFT shows)."""
  from tirjax.trainer import resolve
  jobs = ablation.plan(ablate_config.get_config(f"grid=credit_k{k}"), str(tmp_path))
  warm = [j for j in jobs if j.estimator == "sft"]
  assert sorted(j.seed for j in warm) == list(range(5)) and len({j.label for j in warm}) == 1
  assert sorted({j.label for j in jobs if j.estimator != "sft"}) == cells
  for job in jobs:
    c = _flat(ablation.build_config(job.recipe))
    assert (c["env.toolworld.chain_family"], c["env.toolworld.chain_directions"],
            c["env.toolworld.p_down"]) == ("knockout", k, 0.0)
    assert c["rollout.max_steps"] >= 2 * k + 2  # the 2K + 1 tool steps and the answer
    assert c["rollout.strict_directions"] == (job.estimator == "hidifftir")
    if job.estimator != "sft":
      evals = 1 + c["train.steps"] // c["train.eval_every"]
      assert c["train.eval_subset"] >= 128 and evals >= 8 and c["rollout.n"] == 12
  from tirjax.env.toolworld import Difficulty, make_tasks
  drawn = make_tasks("train", 50, difficulty=Difficulty(chain_directions=k,
                                                        chain_family="knockout", p_down=0.0))
  widest = max(len(step) for t in drawn for step in t.gt_calls)
  assert c["rollout.shapes.max_calls"] >= widest  # the first step's look-ups fit
  assert c["rollout.shapes.max_gt_calls"] >= max(len(t.flat_gt_calls) for t in drawn)
  assert c["rollout.max_steps"] >= max(len(t.gt_calls) for t in drawn) + 1
  from tirjax.env.toolworld import DemoOptions, demo_tokens, make_demos
  demos = make_demos(drawn, options=DemoOptions(p_confuse=1.0,
                                                answer_protocol=c["rollout.answer_protocol"]))
  assert c["rollout.shapes.max_tokens"] >= max(len(demo_tokens(tokenizer, d)[0]) for d in demos)
  record = lambda label: resolve.config_record(ablation.build_config(
      next(j for j in jobs if j.label == label and j.seed == 0).recipe))
  a, b = record("oracle"), record("grpo")
  assert {k: v for k, v in a.items() if k != "advantage"} == {
      k: v for k, v in b.items() if k != "advantage"}


def test_a_key_added_after_the_warm_starts_leaves_their_labels_at_its_default(monkeypatch):
  """env.toolworld.chain_family enters a warm start's label only away from its default, so
  that the grids from before it keep their labels (and the warm starts on disk)."""
  from tirjax.ablation import grid as grid_lib
  config = grpo_config.get_config("model=tiny")
  label = grid_lib._signature(config)
  with config.unlocked():
    config.env.toolworld.chain_directions = 4
    config.env.toolworld.chain_family = "knockout"
  knockout = grid_lib._signature(config)
  with config.unlocked():
    config.env.toolworld.chain_family = ""
  assert grid_lib._signature(config) != knockout
  with config.unlocked():
    config.env.toolworld.chain_directions = 0
  assert grid_lib._signature(config) == label
  monkeypatch.setattr(grid_lib, "_UNSIGNED_DEFAULTS", {})
  assert grid_lib._signature(config) != label
