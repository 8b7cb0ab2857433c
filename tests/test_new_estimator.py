"""A new estimator is three files (issue 57): its kernel, its reference and its test.

The three files are the code blocks of docs/adding_an_estimator.md under their "### `path`"
headings, written as they are into a temporary folder put on PYTHONPATH (an addition folder,
`tirjax/plugin_path.py`), never into the repository. Processes started with that folder then
find the estimator (no list names it) and see it where the registration puts it: its own
test passes, `tests/test_estimators.py` runs it, it joins the ablation grids with a config
(`configs/estimator.py`, the generic path), the credit bench's cells, the kernel bench and the
docs' table, and `--print_config` prints its config. The table of docs/formulas.md is the
registry's, as generated.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from tirjax import advantages, plugin_path
from tirjax.reporting import estimator_table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GUIDE = os.path.join(ROOT, "docs", "adding_an_estimator.md")
NAME = "sign_baseline"
FILES = {f"tirjax/advantages/{NAME}.py", f"tirjax/testing/reference/{NAME}.py",
         f"tests/test_{NAME}.py"}
_BLOCK = re.compile(r"^### `([^`]+)`\n\n```python\n(.*?)\n```$", re.M | re.S)


def guide_files(text: str) -> dict[str, str]:
  """{path: source} of each code block under a "### `path`" heading of the guide."""
  return {path: source + "\n" for path, source in _BLOCK.findall(text)}


def test_the_guide_shows_three_files_of_an_estimator_the_repository_does_not_have():
  with open(GUIDE, encoding="utf-8") as f:
    files = guide_files(f.read())
  assert set(files) == FILES
  assert NAME not in advantages.names()
  assert not any(os.path.exists(os.path.join(ROOT, p)) for p in FILES)


@pytest.fixture(scope="module")
def added(tmp_path_factory):
  """(folder holding the guide's three files, environment that puts it on PYTHONPATH)."""
  folder = tmp_path_factory.mktemp("addition")
  with open(GUIDE, encoding="utf-8") as f:
    for path, source in guide_files(f.read()).items():
      (folder / path).parent.mkdir(parents=True, exist_ok=True)
      (folder / path).write_text(source)
  shutil.copy(os.path.join(ROOT, "tests", "conftest.py"), folder / "tests")  # the suite's set-up
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(folder), ROOT]))
  return folder, env


def _run(args, env, cwd=ROOT, timeout=600) -> str:
  done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                        text=True, timeout=timeout, check=False)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  return done.stdout + done.stderr


@pytest.mark.slow
def test_its_own_test_passes_and_the_estimator_tests_run_it(added):
  folder, env = added
  out = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
              os.path.join(ROOT, "pytest.ini"), str(folder / "tests" / f"test_{NAME}.py")], env)
  assert re.search(r"\b5 passed\b", out), out[-2000:]
  # Every registered estimator's degenerate batches, and the zeros of a group-normalised one.
  out = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_estimators.py",
              "-k", NAME], env)
  passed = int(re.search(r"(\d+) passed", out).group(1))
  assert passed >= 15, out[-2000:]  # 10 degenerate cases, 7 zero cases, its protocol


CHECKS = textwrap.dedent(f"""
    import json
    from configs import ablate
    from tirjax import ablation, advantages
    from tirjax.ablation import grid
    from tirjax.credit import cells
    from tirjax.reporting import estimator_table
    from tirjax.testing import short_runs
    from tirjax.testing.reference import REFERENCES

    name = {NAME!r}
    jobs = ablation.plan(ablate.get_config("grid=beyond_smoke,seeds=1"), "unused_workdir")
    job, = [j for j in jobs if j.label == name]
    config = grid.build_config(job.recipe)
    print(json.dumps(dict(
        registered=name in advantages.names(),
        grids=sorted(g for g, labels in ablate.GRIDS.items() if name in labels),
        config_file=job.recipe.config_file, arg=job.recipe.arg,
        config=[config.advantage.name, config.rollout.mode, config.loss.aggregation],
        short_config=short_runs.config(name, "model=tiny").advantage.name,
        credit_cell=name in cells.default_labels(),
        reference=REFERENCES[name].__module__,
        table=any(line.startswith(f"| `{{name}}` |")
                  for line in estimator_table.table().splitlines()))))
""")


@pytest.mark.slow
def test_it_joins_the_grids_with_a_config_the_credit_cells_and_the_docs_table(added):
  _, env = added
  got = json.loads(_run(["-c", CHECKS], env).strip().splitlines()[-1])
  assert got == {
      "registered": True, "grids": ["all", "beyond", "beyond_smoke", "estimators"],
      "config_file": os.path.join(ROOT, "configs", "estimator.py"),
      "arg": f"{NAME},steps=2",
      "config": [NAME, "independent", "seq_mean_token_mean"], "short_config": NAME,
      "credit_cell": True, "reference": f"tirjax.testing.reference.{NAME}", "table": True}


@pytest.mark.slow
def test_its_config_prints_and_the_kernel_bench_times_it(added, tmp_path):
  _, env = added
  out = _run(["-m", "experiments.train", f"--config=configs/estimator.py:{NAME},model=tiny",
              "--print_config"], env)
  assert f"advantage.name = '{NAME}'" in out, out[-2000:]
  result = tmp_path / "bench.json"
  _run(["-m", "benchmarks.bench_kernels", f"--only={NAME}", "--queries=2", "--repeats=1",
        "--ref_repeats=1", f"--json={result}"], env)
  records = json.loads(result.read_text())["records"]
  assert [r["name"] for r in records] == [NAME] and records[0]["speedup"] > 0


def test_the_docs_table_is_the_registry_s():
  with open(estimator_table.PATH, encoding="utf-8") as f:
    text = f.read()
  assert estimator_table.rewritten(text) == text, (
      "docs/formulas.md's estimators' table differs from the registry: run "
      "python -m tirjax.reporting.estimator_table")


def test_a_stale_docs_table_is_seen():
  with open(estimator_table.PATH, encoding="utf-8") as f:
    text = f.read()
  row = estimator_table.row("grpo")
  assert row in text
  stale = text.replace(row + "\n", "")
  assert estimator_table.rewritten(stale) == text != stale
  with pytest.raises(ValueError, match="must enclose"):
    estimator_table.rewritten(text.replace(estimator_table.MARKERS[1], ""))


def test_an_addition_folder_joins_a_package_and_another_checkout_does_not(tmp_path,
                                                                           monkeypatch):
  addition, checkout = tmp_path / "addition", tmp_path / "checkout"
  for root in (addition, checkout):
    (root / "tirjax" / "advantages").mkdir(parents=True)
  (checkout / "tirjax" / "__init__.py").write_text("")
  monkeypatch.setattr(sys, "path", [str(checkout), str(addition), str(addition)])
  own = os.path.join(ROOT, "tirjax", "advantages")
  assert plugin_path.extend([own], "tirjax.advantages") == [
      own, os.path.realpath(addition / "tirjax" / "advantages")]
