"""Figures live in results files (issue 57): a config docstring states settings and links its
results, and a results file names runs relative to the repository.

What counts as a figure, and where one may come from, is `tirjax.testing.doc_figures`'s
docstring: a decimal or a percentage; a setting of a pinned config, or written in a results file
that the docstring names. The estimators' configs quote no results at all.
"""

import json
import os
import shutil

import pytest

from tirjax import advantages
from tirjax.testing import doc_figures

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_figure_of_a_config_docstring_is_a_setting_or_in_a_results_file_it_links():
  found = doc_figures.config_figures(ROOT)
  assert len(found) > 10  # the settings the docstrings state (ε_high = 0.28, γ = 0.95, ...)
  assert [(f.where, f.text) for f in doc_figures.unsourced(ROOT)] == []


def test_the_estimators_configs_link_their_results_and_quote_none():
  quoted = [(f.where, f.text) for f in doc_figures.config_figures(ROOT)
            if os.path.splitext(os.path.basename(f.path))[0] in advantages.names()
            and not doc_figures.is_setting(f, ROOT)]
  assert quoted == []


@pytest.mark.parametrize("text, want", [
    ("eval accuracy 0.135 ± 0.030 from 0.125.", ["0.030", "0.125", "0.135"]),
    ("18% of rows, 7.6-9.2 min", ["18%", "7.6", "9.2"]),
    ("lr 1e-6, `--config.loss.clip_high=0.28`", ["0.28", "1e-6"]),
    ("n = 8 rows, T_max = 6, 3 seeds, 1,200 SFT steps, Eq. 16, App. A.5", []),
    ("spec §4.3, arXiv 2503.19595, qwen3_1p7b, Qwen3-1.7B, v0.10.2, results/x_0.5.json", []),
])
def test_what_counts_as_a_figure(text, want):
  assert sorted(f for _, f in doc_figures.figures_in(text)) == want


def _tree(tmp_path, docstring: str, results: dict) -> str:
  (tmp_path / "configs").mkdir()
  (tmp_path / "configs" / "grpo.py").write_text(f'"""{docstring}"""\n')
  (tmp_path / "tests").mkdir()
  shutil.copy(os.path.join(ROOT, doc_figures.SNAPSHOT), tmp_path / "tests")
  for name, text in results.items():
    (tmp_path / doc_figures.RESULTS / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / doc_figures.RESULTS / name).write_text(text)
  doc_figures.settings.cache_clear()
  doc_figures.results_text.cache_clear()
  return str(tmp_path)


@pytest.mark.parametrize("docstring, results, unsourced", [
    # a copied figure without its source, or with a source that does not hold it (rerun)
    ("Accuracy 0.4321 (3 seeds).", {}, ["0.4321"]),
    ("Accuracy 0.4321: benchmarks/results/run.json.", {"run.json": '{"acc": 0.4399}'},
     ["0.4321"]),
    # a figure in a results file the docstring does not name
    ("Accuracy 0.4321.", {"run.json": '{"acc": 0.4321}'}, ["0.4321"]),
    ("12.5% of rows: benchmarks/results/a/", {"b.json": '{"share": 0.125}'}, ["12.5%"]),
    # linked, by file or folder, and written there (a percentage also as its fraction)
    ("Accuracy 0.4321: benchmarks/results/run.json.", {"run.json": '{"acc": 0.4321}'}, []),
    ("12.5% of rows: benchmarks/results/a/", {"a/b.json": '{"share": 0.125}'}, []),
    # a setting of the config: GRPO's ε = 0.2, its tiny preset's learning rate 3e-4
    ("ε = 0.2, lr 3e-4", {}, []),
])
def test_a_figure_without_its_source_fails(tmp_path, docstring, results, unsourced):
  root = _tree(tmp_path, docstring, results)
  try:
    assert [f.text for f in doc_figures.unsourced(root)] == unsourced
  finally:
    doc_figures.settings.cache_clear()
    doc_figures.results_text.cache_clear()


def test_no_results_file_names_a_machine_path():
  assert doc_figures.machine_paths(ROOT) == []


def test_a_machine_path_in_a_results_file_is_found(tmp_path):
  results = tmp_path / doc_figures.RESULTS / "sub"
  results.mkdir(parents=True)
  (results / "r.json").write_text(json.dumps({
      "policy": "/work/runs/ws_default_s0", "relative": "../runs/ws_default_s0",
      "command": "python -m x --json=/tmp/w27/a.json --data=../shared/data (in /usr/bin/time)",
      "url": "http://127.0.0.1:8000/work/x"}, indent=1))
  found = doc_figures.machine_paths(str(tmp_path))
  assert [(p, path) for p, _, path in found] == [
      ("benchmarks/results/sub/r.json", "/work/runs/ws_default_s0"),
      ("benchmarks/results/sub/r.json", "/tmp/w27/a.json")]
