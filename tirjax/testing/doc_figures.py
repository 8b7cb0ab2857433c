"""Figures in the config docstrings, and where each one may come from (issue 57).

A measured result lives in a results file under benchmarks/results/; a docstring links the file
and does not copy its figures, which go stale when the measurement is rerun. This module finds
the figures a docstring of configs/ gives (module, class and function docstrings, as
`doc_commands` reads them) and says which have no source. `tests/test_doc_figures.py` fails on
any.

What counts as a figure: a number written with a decimal point or an exponent (0.135, 1e-6),
and any number with a percent sign (18%), which is how measured quantities are written.
Integers are not: in a config's docs they are counts and sizes of the design (n = 8 rows,
T_max = 6, 3 seeds, 40 RL steps), set, not measured. Nor are a spec section (§4.3), an arXiv
identifier, or digits inside a name or path (`qwen3_1p7b`, `Qwen3-1.7B`, `1.7B`).

Where a figure may come from:
  * a setting: it equals a value of a config (any key, any pinned preset of
    tests/config_snapshot.json; the docstrings of an estimator's file against that estimator's
    configs, those of the other files against every estimator's): a hyper-parameter such as
    ε_high = 0.28 or lr 1e-6, which the docs may state as the command line may set it;
  * a results file that the same docstring names: it is written, as in the docstring, in a
    text file under benchmarks/results/ that the docstring gives by its path or by a folder
    above it (a percentage also as its fraction: 18% as 0.18). A figure then sits beside its
    source, and when the measurement is rerun and the file changes, the copy fails instead of
    going stale.

The estimators' configs (configs/<estimator>.py) link their results and quote none: all their
figures are settings (tests/test_doc_figures.py).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import glob
import json
import math
import os
import re

# A number with a decimal point or an exponent, or with a percent sign; not after a word
# character, '.', '/', '§' or '-' (a name, a path, a section, a range's second half is taken
# with its own boundary below), nor followed by a word character (1.7B).
_NUMBER = re.compile(r"(?<![\w.§/\-])(-?\d+(?:\.\d+)?(?:e-?\d+)?)(%?)(?![\w%]|\.\d)")
_ARXIV = re.compile(r"arXiv:?\s*\d+\.\d+")
_RANGE_END = re.compile(r"(?<=\d)-(\d+\.\d+)(?![\w]|\.\d)")  # 7.6-9.2: both ends are figures
RESULTS = "benchmarks/results"
SNAPSHOT = "tests/config_snapshot.json"


_LINK = re.compile(r"benchmarks/results/[\w./\-]*")


@dataclasses.dataclass(frozen=True)
class Figure:
  path: str  # relative to the repository's root
  line: int
  text: str  # as written, e.g. "0.135" or "18%"
  links: tuple[str, ...] = ()  # the results paths its docstring names

  @property
  def where(self) -> str:
    return f"{self.path}:{self.line}"


def figures_in(text: str) -> list[tuple[int, str]]:
  """(0-based line, figure as written) of each figure in `text` (the module docstring)."""
  text = _ARXIV.sub(lambda m: " " * len(m.group()), text)
  out = []
  for pattern in (_NUMBER, _RANGE_END):
    for m in pattern.finditer(text):
      number = m.group(1)
      percent = pattern is _NUMBER and m.group(2) == "%"
      if percent or "." in number or "e" in number:
        out.append((text.count("\n", 0, m.start()), number + ("%" if percent else "")))
  return sorted(out)


def docstrings(source: str) -> list[tuple[int, str]]:
  """(1-based first line, text) of the module's, classes' and functions' docstrings."""
  out = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      if (node.body and isinstance(node.body[0], ast.Expr)
          and isinstance(node.body[0].value, ast.Constant)
          and isinstance(node.body[0].value.value, str)):
        out.append((node.body[0].lineno, node.body[0].value.value))
  return out


def config_figures(root: str) -> list[Figure]:
  """Every figure in the docstrings of configs/*.py."""
  out = []
  for path in sorted(glob.glob(os.path.join(root, "configs", "*.py"))):
    with open(path, encoding="utf-8") as f:
      source = f.read()
    rel = os.path.relpath(path, root)
    for first, text in docstrings(source):
      links = tuple(sorted({m.rstrip(".,;:") for m in _LINK.findall(text)}))
      out += [Figure(rel, first + i, figure, links) for i, figure in figures_in(text)]
  return out


def _numbers(value) -> set[float]:
  if isinstance(value, bool):
    return set()
  if isinstance(value, (int, float)):
    return {float(value)}
  if isinstance(value, dict):
    return set().union(*map(_numbers, value.values())) if value else set()
  if isinstance(value, (list, tuple)):
    return set().union(*map(_numbers, value)) if value else set()
  return set()


@functools.cache
def settings(root: str) -> dict[str, frozenset[float]]:
  """{estimator: every number among its pinned configs' values}."""
  with open(os.path.join(root, SNAPSHOT), encoding="utf-8") as f:
    pinned = json.load(f)
  return {name: frozenset(_numbers(cases)) for name, cases in pinned.items()}


@functools.cache
def results_text(root: str, link: str) -> str:
  """The text files at `link` (a results file, or every file under a results folder), joined."""
  path = os.path.join(root, link)
  paths = ([path] if os.path.isfile(path) else
           sorted(glob.glob(os.path.join(path, "**", "*"), recursive=True)))
  parts = []
  for p in paths:
    if os.path.isfile(p) and p.endswith((".json", ".md", ".csv", ".txt")):
      with open(p, encoding="utf-8", errors="replace") as f:
        parts.append(f.read())
  return "\n".join(parts)


def _written(number: str, text: str) -> bool:
  return re.search(rf"(?<![\d.]){re.escape(number)}(?![\d])", text) is not None


def is_setting(figure: Figure, root: str) -> bool:
  if figure.text.endswith("%"):
    return False
  name = os.path.splitext(os.path.basename(figure.path))[0]
  known = settings(root)
  pool = known[name] if name in known else frozenset().union(*known.values())
  value = float(figure.text)
  return any(math.isclose(value, v, rel_tol=1e-9, abs_tol=0.0) for v in pool)


def in_results(figure: Figure, root: str) -> bool:
  """Whether `figure` is written in a results file its docstring names."""
  text = "\n".join(results_text(root, link) for link in figure.links)
  if figure.text.endswith("%"):
    number = figure.text[:-1]
    fraction = float(number) / 100
    places = len(number.partition(".")[2]) + 2
    return _written(figure.text, text) or _written(f"{fraction:.{places}f}", text)
  return _written(figure.text, text)


def unsourced(root: str) -> list[Figure]:
  """The figures of configs/ docstrings that are neither a setting nor in a results file
  that their docstring names."""
  return [f for f in config_figures(root) if not is_setting(f, root) and not in_results(f, root)]


# Absolute paths that name a place on one machine (a run, a data file, a temporary file), which
# a results file names relative to the repository instead: `../runs/<name>` for a run beside
# the checkout, `runs/<name>` inside it, `../shared/...` for the shared data, `$TMPDIR/...` for
# a temporary file. A system program (/usr/bin/time) is no run and stays.
_MACHINE_PATH = re.compile(
    r"(?<![\w.:/~$])/(?:work|tmp|home|root|mnt|Users|scratch|private|var|data)/[^\s\"'`,;)|]*")
RESULT_SUFFIXES = (".json", ".md", ".csv", ".txt")


def machine_paths(root: str) -> list[tuple[str, int, str]]:
  """(results file relative to `root`, 1-based line, path) of every absolute machine path in
  the text files under benchmarks/results/."""
  out = []
  pattern = os.path.join(root, RESULTS, "**", "*")
  for path in sorted(glob.glob(pattern, recursive=True)):
    if os.path.isfile(path) and path.endswith(RESULT_SUFFIXES):
      with open(path, encoding="utf-8", errors="replace") as f:
        for i, line in enumerate(f, 1):
          out += [(os.path.relpath(path, root), i, m) for m in _MACHINE_PATH.findall(line)]
  return out
