"""The `python -m experiments.<name> ...` (and `benchmarks.<name>`, `experiments.studies.<name>`)
commands the documentation gives, found where they are written: README.md, docs/*.md, and the
docstrings of configs/, experiments/, experiments/studies/ and benchmarks/ modules (module,
class and function docstrings; commands in code are not documentation).

A command starts at `python -m <module>` (a line may wrap inside it) and ends with its
line, or, where a line ends in a backslash, with the line that does not; one inside a backtick span (`...`) of prose
ends at the closing backtick, on whichever line. A shell comment (` # ...`) and the quote that
closes an enclosing shell string (`--command="... python -m ..."`) are not part of it.
`tests/test_docs.py` checks every command collected here.
"""

from __future__ import annotations

import ast
import dataclasses
import glob
import os
import re
import shlex
from typing import Iterator, Sequence

SOURCES = ("README.md", "docs/*.md", "configs/*.py", "experiments/*.py",
           "experiments/studies/*.py", "benchmarks/*.py")
# (a line may wrap between `python`, `-m` and the module)
_START = re.compile(r"python\s+-m\s+((?:experiments|benchmarks)(?:\.\w+)+)")


@dataclasses.dataclass(frozen=True)
class DocCommand:
  """One documented command: where it is written, its module and its arguments."""

  path: str  # relative to the repository's root
  line: int  # 1-based, the line of `python -m`
  module: str  # e.g. "experiments.train"
  text: str  # the arguments as written (continuation lines joined)

  @property
  def where(self) -> str:
    return f"{self.path}:{self.line}"

  def args(self) -> list[str]:
    """The arguments as a shell splits them; a `ValueError` names the command's place."""
    try:
      return shlex.split(self.text)
    except ValueError as e:
      raise ValueError(f"{self.where}: cannot split `{self.text}` as a shell would: {e}") from None


def collect(root: str) -> list[DocCommand]:
  """Every documented command under the repository `root`, in file and line order."""
  out = []
  for pattern in SOURCES:
    for path in sorted(glob.glob(os.path.join(root, pattern))):
      rel = os.path.relpath(path, root)
      with open(path, encoding="utf-8") as f:
        source = f.read()
      blocks = _docstrings(source) if path.endswith(".py") else [(1, source)]
      for first_line, text in blocks:
        out += [DocCommand(rel, first_line + i, module, args)
                for i, module, args in commands_in(text)]
  return out


def commands_in(text: str) -> Iterator[tuple[int, str, str]]:
  """(0-based line, module, arguments as written) of each command in `text`."""
  lines = text.split("\n")
  for match in _START.finditer(text):
    first, column = _place(text, match.start())
    last, end = _place(text, match.end())
    yield first, match.group(1), _arguments(lines, last, end, _in_backticks(lines, first, column))


def _place(text: str, offset: int) -> tuple[int, int]:
  """(line, column) of `offset` in `text`."""
  line = text.count("\n", 0, offset)
  return line, offset - (text.rfind("\n", 0, offset) + 1)


def _in_backticks(lines: Sequence[str], i: int, column: int) -> bool:
  """Whether `lines[i][column]` lies inside a backtick span: an odd number of backticks before
  it in its paragraph (a span does not cross a blank line), fence lines (```) not counted."""
  start = i
  while start > 0 and lines[start - 1].strip():
    start -= 1
  before = [l for l in lines[start:i] if not l.strip().startswith("```")] + [lines[i][:column]]
  return sum(l.count("`") for l in before) % 2 == 1


def _arguments(lines: Sequence[str], i: int, start: int, inline: bool) -> str:
  """The arguments of the command that starts at `lines[i][start:]` (module docstring)."""
  parts, text = [], lines[i][start:]
  while True:
    if inline:
      if "`" in text:
        parts.append(text.split("`", 1)[0])
        break
    else:
      text = re.sub(r"(^|\s)#.*$", "", text)  # a shell comment
      if not text.rstrip().endswith("\\"):
        parts.append(text)
        break
      text = text.rstrip()[:-1]
    parts.append(text)
    i += 1
    if i == len(lines):
      break
    text = lines[i]
  joined = " ".join(p.strip() for p in parts).strip()
  if joined.endswith('"') and joined.count('"') % 2:  # closes the enclosing shell string
    joined = joined[:-1].rstrip()
  return joined


def _docstrings(source: str) -> list[tuple[int, str]]:
  """(line of the opening quotes, text) of each docstring of a Python `source`: the string's
  line i is the source's line `first + i`."""
  out = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      text = ast.get_docstring(node, clean=False)
      if text is not None:
        out.append((node.body[0].lineno, text))
  return sorted(out)
