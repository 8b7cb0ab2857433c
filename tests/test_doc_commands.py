"""Finding the documented commands (`tirjax.testing.doc_commands`): where a command starts and
ends in Markdown and in docstrings, at which line. tests/test_docs.py checks them."""

import os
import textwrap

import pytest

from tirjax.testing import doc_commands

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MARKDOWN = textwrap.dedent('''\
    # Title

    ```bash
    python -m experiments.train --config=configs/a.py:model=tiny --workdir=runs/a
    nice -n 19 python -m experiments.report runs/a --out=r/   # a comment
    python -m experiments.train --config=configs/b.py \\
        --workdir=runs/b
    ```

    Prose with `make x
    Y=1`, then `python -m benchmarks.bench_vllm
    --json=v.json` across lines, and `python -m experiments.studies.step_time` alone.

    A shell string: --command="
      cd x && python -m experiments.train \\
        --workdir=/w"
    Not a command: python3 -m experiments.train, nor `experiments.train --x`. A wrapped one:
    `python -m
    experiments.report z --out=w`.
    ''')

PYTHON = textwrap.dedent('''\
    """Module docstring.

        python -m experiments.ablate --config=configs/ablate.py:grid=portool \\\\
            --workdir=runs/p  # on 8 cores
    """

    COMMAND = "python -m experiments.train --not=documentation"


    def f():
      """A function's: `python -m experiments.evaluate --policy=<run dir> --out=o`."""
    ''')


def test_commands_in_markdown_and_docstrings_with_their_lines(tmp_path):
  (tmp_path / "docs").mkdir()
  (tmp_path / "experiments").mkdir()
  (tmp_path / "README.md").write_text(MARKDOWN)
  (tmp_path / "docs" / "guide.md").write_text("See `python -m experiments.report x --out=y`.\n")
  (tmp_path / "experiments" / "tool.py").write_text(PYTHON)
  got = [(c.where, c.module, c.text) for c in doc_commands.collect(str(tmp_path))]
  assert got == [
      ("README.md:4", "experiments.train", "--config=configs/a.py:model=tiny --workdir=runs/a"),
      ("README.md:5", "experiments.report", "runs/a --out=r/"),
      ("README.md:6", "experiments.train", "--config=configs/b.py --workdir=runs/b"),
      ("README.md:11", "benchmarks.bench_vllm", "--json=v.json"),
      ("README.md:12", "experiments.studies.step_time", ""),
      ("README.md:15", "experiments.train", "--workdir=/w"),
      ("README.md:18", "experiments.report", "z --out=w"),
      ("docs/guide.md:1", "experiments.report", "x --out=y"),
      ("experiments/tool.py:3", "experiments.ablate",
       "--config=configs/ablate.py:grid=portool --workdir=runs/p"),
      ("experiments/tool.py:11", "experiments.evaluate", "--policy=<run dir> --out=o"),
  ]
  assert doc_commands.collect(str(tmp_path))[0].args() == [
      "--config=configs/a.py:model=tiny", "--workdir=runs/a"]
  bad = doc_commands.DocCommand("README.md", 3, "experiments.train", "--x='unclosed")
  with pytest.raises(ValueError, match="README.md:3: cannot split"):
    bad.args()


def test_the_repository_documents_at_least_50_commands():
  commands = doc_commands.collect(ROOT)
  assert len(commands) >= 50
  assert {"experiments.train", "experiments.evaluate", "experiments.ablate",
          "experiments.report", "benchmarks.bench_kernels"} <= {c.module for c in commands}
