"""Every documented command runs as written (issue 41).

Each `python -m experiments....` command of README.md, docs/ and the docstrings of configs/
and experiments/ (collected by `tirjax.testing.doc_commands`, not listed here) is checked as
its entry point would run it up to the first compute (`tirjax.testing.doc_check`: its own flag
parsing, then its `check(argv)`: the train config resolved with shapes fitted to its data, an
evaluation's policy and data, an ablation grid planned, a report's runs read). A command whose
doc is wrong fails, named by file and line. The commands run from a copy of the repository's
root whose `runs/` holds what the documented commands before them make (`runs/default`: the
smoke run of `make run`'s command; `runs/ablate`: a prepared smoke grid) and whose `../shared`
is the repository's. Then the user-facing entry points run end to end in smoke form
(`smoke=1`: a few steps on a few tasks): train (the fixture that makes `runs/default`),
evaluate on each dataset of ../shared/data and on BFCL, bench_kernels; ablate's and report's
run on the smoke grid in tests/test_ablate.py.
"""

import json
import os
import re
import subprocess
import sys

import pytest

from configs import ablate as ablate_config
from tirjax import ablation
from tirjax.testing import doc_commands

pytestmark = [pytest.mark.xdist_group("docs"), pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.normpath(os.path.join(ROOT, "..", "shared"))
COMMANDS = doc_commands.collect(ROOT)
DATASETS = {"toolhop": "toolhop/toolhop100.jsonl", "ftrl": "ftrl/ftrl_test.parquet"}

# What a reader puts in place of a documented placeholder, or what an earlier documented
# command made: a policy checkpoint is the smoke run's export (the tiny model with the toolworld
# tokenizer stands in for Qwen's: shapes are sized with it), a run directory one of the
# prepared smoke grid. A placeholder without a stand-in here fails its command's test.
STAND_INS = {
    "<run dir>": "runs/ablate/grpo/seed0",
    "<name>": "grpo",
    "/path/to/Qwen3-1.7B": "runs/default/hf_export",
    "/mnt/shared/Qwen3-1.7B": "runs/default/hf_export",
    "$CKPT": "runs/default/hf_export",
    "$URLS": "http://127.0.0.1:8000,http://127.0.0.1:8001",
    "[--time_env]": "--time_env",
}
PLACEHOLDER = re.compile(r"<[^>]*>|\$\{?\w+|/path/to/|\.\.\.|\[-")


def written(command: doc_commands.DocCommand) -> list[str]:
  """The command's arguments with the stand-ins put in (a placeholder left names its place)."""
  text = command.text
  for placeholder, stand_in in STAND_INS.items():
    text = text.replace(placeholder, stand_in)
  left = PLACEHOLDER.search(text)
  if left:
    raise AssertionError(f"{command.where}: placeholder {left.group(0)!r} has no stand-in in "
                         "tests/test_docs.py STAND_INS")
  return doc_commands.DocCommand(command.path, command.line, command.module, text).args()


def env_for(cache: str, devices: int = 8) -> dict:
  """The environment of a command: this checkout, its own tokenizer cache, `devices` CPU
  devices (the checks: 8, so that mesh presets resolve; the smoke runs: 1, a CPU machine's)."""
  return {**os.environ, "PYTHONPATH": ROOT, "TIRJAX_CACHE": cache, "JAX_PLATFORMS": "cpu",
          "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices} "
                       "--xla_backend_optimization_level=0"}


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
  """A directory laid out as the repository's root (its entries linked) beside `shared`, with
  an empty runs/ and a tokenizer cache of its own."""
  top = tmp_path_factory.mktemp("clone")
  root = top / "tirjax"
  root.mkdir()
  for name in os.listdir(ROOT):
    if name not in ("runs", ".git"):
      os.symlink(os.path.join(ROOT, name), root / name)
  (root / "runs").mkdir()
  if os.path.isdir(SHARED):
    os.symlink(SHARED, top / "shared")
  return str(root), str(top / "cache")


@pytest.fixture(scope="module")
def default_run(mirror):
  """`make run`'s documented command (experiments/train.py's docstring) in smoke form, its
  output to a pipe: runs/default, the policy of the evaluate example."""
  root, cache = mirror
  (train,) = [c for c in COMMANDS if c.where == "experiments/train.py:3"]
  argv = [a.replace("model=tiny", "model=tiny,smoke=1") for a in written(train)]
  assert argv == ["--config=configs/hidifftir.py:model=tiny,smoke=1", "--workdir=runs/default"]
  proc = subprocess.run([sys.executable, "-m", train.module, *argv], cwd=root,
                        env=env_for(cache, devices=1), capture_output=True, timeout=900)
  assert proc.returncode == 0, proc.stderr.decode()[-3000:]
  return os.path.join(root, "runs", "default"), proc.stdout + proc.stderr


def test_the_smoke_run_of_the_default_finishes_and_its_log_is_lines(default_run):
  workdir, output = default_run
  assert json.load(open(os.path.join(workdir, "status.json")))["state"] == "finished"
  assert os.path.isfile(os.path.join(workdir, "hf_export", "config.json"))
  # output to a pipe: progress as lines, no bar redrawn (issue 41, "logs a file can hold")
  assert b"\r" not in output
  text = output.decode()
  assert "sft step 2/2 loss " in text and "rl step 2/2 reward " in text
  assert "| eval accuracy |" in text


@pytest.fixture(scope="module")
def grid(mirror, default_run):
  """runs/ablate: the documented smoke grid planned and prepared (cell.json written, nothing
  run; its warm start's export is the smoke run's), as `experiments.ablate` leaves a grid before
  its first run; runs/a and runs/b: two of its runs; runs/credit: the grid again (the credit
  verdict's input)."""
  root, _ = mirror
  cwd = os.getcwd()
  os.chdir(root)  # the grid's paths are read from the current directory, as ablate's
  try:
    jobs = ablation.plan(ablate_config.get_config("grid=smoke"), "runs/ablate")
    ablation.prepare(jobs)
  finally:
    os.chdir(cwd)
  for job in jobs:
    if job.estimator == "sft":
      os.symlink(os.path.join(default_run[0], "hf_export"),
                 os.path.join(root, job.workdir, "hf_export"))
  os.symlink(os.path.join(root, "runs/ablate/grpo"), os.path.join(root, "runs/a"))
  os.symlink(os.path.join(root, "runs/ablate/portool"), os.path.join(root, "runs/b"))
  os.symlink(os.path.join(root, "runs/ablate"), os.path.join(root, "runs/credit"))
  return jobs


@pytest.fixture(scope="module")
def checked(mirror, grid, tmp_path_factory):
  """{place: "ok" or the error} of every documented command (one `doc_check` process)."""
  del grid
  root, cache = mirror
  work = tmp_path_factory.mktemp("doc_check")
  commands, unwritable = [], {}
  for c in COMMANDS:
    try:
      commands.append({"id": c.where, "module": c.module, "argv": written(c)})
    except (AssertionError, ValueError) as e:
      unwritable[c.where] = str(e)
  (work / "commands.json").write_text(json.dumps(commands))
  proc = subprocess.run([sys.executable, "-m", "tirjax.testing.doc_check",
                         str(work / "commands.json"), str(work / "results.json")],
                        cwd=root, env=env_for(cache), capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return {**json.load(open(work / "results.json")), **unwritable}


def test_the_docs_hold_at_least_50_commands_found_in_every_source():
  assert len(COMMANDS) >= 50
  sources = {c.path.split("/")[0] if "/" in c.path else c.path for c in COMMANDS}
  assert sources == {"README.md", "docs", "configs", "experiments", "benchmarks"}
  assert len({c.module for c in COMMANDS}) >= 15


@pytest.mark.parametrize("command", COMMANDS, ids=[c.where for c in COMMANDS])
def test_each_documented_command_resolves_as_written(command, checked):
  result = checked[command.where]
  assert result == "ok", f"{command.where}: python -m {command.module} {command.text}\n  {result}"


def test_a_broken_doc_example_fails_naming_its_file_and_line(tmp_path, mirror, grid):
  """The same collection and check on a copy of the docs with examples broken on purpose (an
  env that does not exist, a shape too small for the data, a mistyped flag, a grid the planner
  refuses), each reported at its file and line, the others not."""
  del grid
  root, cache = mirror
  copy = tmp_path / "repo"
  (copy / "experiments").mkdir(parents=True)
  readme = open(os.path.join(ROOT, "README.md")).read()
  broken = readme.replace("--config=configs/portool.py:model=tiny --workdir=runs/portool",
                          "--config=configs/portool.py:model=tiny,env=atlantis "
                          "--workdir=runs/portool", 1).replace(
      "--config.model.hf_checkpoint=/path/to/Qwen3-1.7B",
      "--config.model.hf_checkpoint=/path/to/Qwen3-1.7B --config.rollout.shapes.max_params=2")
  assert broken.count("atlantis") == 1 and broken.count("max_params=2") == 1
  (copy / "README.md").write_text(broken)
  evaluate_doc = open(os.path.join(ROOT, "experiments", "evaluate.py")).read()
  (copy / "experiments" / "evaluate.py").write_text(evaluate_doc.replace(
      "--out=runs/default/eval_toolhop", "--out=runs/default/eval_toolhop --taks=8", 1))
  ablate_doc = open(os.path.join(ROOT, "experiments", "ablate.py")).read()
  (copy / "experiments" / "ablate.py").write_text(ablate_doc.replace(
      "--workdir=runs/ablate", "--workdir=runs/ablate --config.seeds=(-1,)", 1))
  commands = doc_commands.collect(str(copy))
  line = broken.split("\n").index(
      "python -m experiments.train --config=configs/portool.py:model=tiny,env=atlantis "
      "--workdir=runs/portool") + 1
  assert f"README.md:{line}" in [c.where for c in commands]
  spec = [{"id": c.where, "module": c.module, "argv": written(c)} for c in commands]
  (tmp_path / "commands.json").write_text(json.dumps(spec))
  subprocess.run([sys.executable, "-m", "tirjax.testing.doc_check", str(tmp_path / "commands.json"),
                  str(tmp_path / "results.json")], cwd=root, env=env_for(cache), check=True,
                 capture_output=True, timeout=900)
  results = json.load(open(tmp_path / "results.json"))
  assert "env=atlantis: valid values are" in results[f"README.md:{line}"]
  assert re.search(r"ConfigError: rollout\.shapes\.max_params: the \d+ tasks of the train and "
                   r"eval splits need max_params >= \d+ \(now 2; task ", results[
                       f"README.md:{line + 1}"])
  assert "Unknown command line flag 'taks'" in results["experiments/evaluate.py:3"]
  assert "seeds: need a non-empty list of integers >= 0" in results["experiments/ablate.py:3"]
  assert {k for k, v in results.items() if v != "ok"} == {
      f"README.md:{line}", f"README.md:{line + 1}", "experiments/ablate.py:3",
      "experiments/evaluate.py:3"}


# -- The entry points end to end, in smoke form -------------------------------------------

def evaluate_example(root, cache, env, tmp_path):
  """The evaluate docstring's example on `env`, in smoke form: its config with `smoke=1` and
  one task; returns the results it wrote."""
  (example,) = [c for c in COMMANDS if c.where == "experiments/evaluate.py:3"]
  argv = [a.replace("env=toolhop", f"env={env},smoke=1") for a in written(example)]
  argv = [a if not a.startswith("--out=") else f"--out={tmp_path / env}" for a in argv]
  proc = subprocess.run([sys.executable, "-m", example.module, *argv, "--tasks=1"], cwd=root,
                        env=env_for(cache, devices=1), capture_output=True, text=True,
                        timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "| eval accuracy |" in proc.stdout and "\r" not in proc.stderr
  return json.load(open(tmp_path / env / "results.json"))


@pytest.mark.parametrize("env", sorted(DATASETS) + ["bfcl"])
def test_the_evaluate_example_runs_on_each_dataset(env, mirror, default_run, tmp_path):
  del default_run
  root, cache = mirror
  if env in DATASETS and not os.path.exists(os.path.join(SHARED, "data", DATASETS[env])):
    pytest.skip(f"../shared/data/{DATASETS[env]} is not here")
  result = evaluate_example(root, cache, env, tmp_path)
  paper = {"toolhop": "eval/answer_correctness", "ftrl": "eval/solve_f1",
           "bfcl": "eval/bfcl/overall"}[env]
  assert result["env"] == env and result["tasks"] == 1
  assert 0 <= result["metrics"]["eval/accuracy"] <= 1 and 0 <= result["metrics"][paper] <= 1


def test_bench_kernels_documented_command_in_smoke_form(mirror, tmp_path):
  root, cache = mirror
  (bench,) = [c for c in COMMANDS if c.where.startswith("docs/adding_an_estimator.md:")
              and c.module == "benchmarks.bench_kernels"]
  argv = [a if not a.startswith("--json=") else f"--json={tmp_path / 'b.json'}"
          for a in written(bench)]
  assert argv[0] == "--only=grpo"
  smoke = ["--queries=4", "--repeats=1", "--ref_repeats=1"]
  proc = subprocess.run([sys.executable, "-m", bench.module, *argv, *smoke], cwd=root,
                        env=env_for(cache, devices=1), capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  records = json.load(open(tmp_path / "b.json"))["records"]
  assert [r["name"] for r in records] == ["grpo"] and records[0]["jax_ms"] > 0
  assert os.path.isfile(tmp_path / "b.md")  # the result's table beside it
