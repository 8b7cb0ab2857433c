"""The sections of docs/spec.md, the project's specification, and references to them.

The code and the docs cite the specification as `spec §4.1`; a reference may list or span
sections (`spec §4.1, §5`, `spec §4.1-4.3`). `SECTIONS` are the numbered headings of
docs/spec.md (`## 4. Estimators`, `### 4.1 PORTool`). The package never reads docs/ (an
installed package has none): tests/test_spec_refs.py holds `SECTIONS` equal to the file's
headings and every reference in the repository to one of them.
"""

from __future__ import annotations

import re

SECTIONS = ("1", "2", "3", "4", "4.1", "4.2", "4.3", "4.4", "4.5", "5", "5.1", "6", "6.1", "7",
            "8", "9")

_NUMBER = r"\d+(?:\.\d+)*"
_HEADING = re.compile(rf"^#{{2,3}} ({_NUMBER})\.? ", re.MULTILINE)
# `spec §N`, then any run of `-N` / `–N` (a span's end), `, §N` or ` and §N`.
_REFERENCE = re.compile(rf"\bspec §({_NUMBER}(?:\s*[-–]\s*§?{_NUMBER}|\s*,\s*§{_NUMBER}"
                        rf"|\s+and\s+§{_NUMBER})*)")


def headings(markdown: str) -> tuple[str, ...]:
  """The section numbers of the `##` and `###` headings of `markdown`, in order."""
  return tuple(m.group(1) for m in _HEADING.finditer(markdown))


def references(text: str) -> list[tuple[int, str]]:
  """(1-based line, section) of every section a `spec §…` reference in `text` names (both ends
  of a span)."""
  out = []
  for m in _REFERENCE.finditer(text):
    line = text.count("\n", 0, m.start()) + 1
    out += [(line, n) for n in re.findall(_NUMBER, m.group(1))]
  return out


def check(section: str | None, what: str) -> None:
  """Raises ValueError unless `section` is None or one of `SECTIONS`; `what` starts the message."""
  if section is not None and section not in SECTIONS:
    raise ValueError(f"{what}: spec={section!r} names no section of docs/spec.md; its sections "
                     f"are {', '.join(SECTIONS)}")
