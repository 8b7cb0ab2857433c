"""Every `spec §x` reference in the repository names a section of docs/spec.md (issue 57).

The code and the docs cite the project's specification by section. This scans the tracked text
files (.py, .md, .sh, .txt, .ini, .cfg, .toml, .yaml, Makefile; JSON results are records, left
out) for references and fails, naming file and line, on a section that is not a heading of
docs/spec.md, and on any citation of the old specification outside the repository.
"""

import os
import subprocess

import pytest

from tirjax import advantages, spec_sections

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = os.path.join(ROOT, "docs", "spec.md")
SUFFIXES = (".py", ".md", ".sh", ".txt", ".ini", ".cfg", ".toml", ".yaml", ".yml")
# The old specification's citations, spelled so that this file holds none of them.
OLD = ("SPEC" + " §", "SPEC" + ".md", "shared/" + "SPEC")
BOGUS = "spec " + "§4.9"  # a section docs/spec.md lacks (written so that this file cites none)


def text_files(root: str) -> list[str]:
  """The repository's tracked text files (every file under `root` where git is absent)."""
  try:
    listed = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True,
                            check=True).stdout.splitlines()
  except (OSError, subprocess.CalledProcessError):
    listed = [os.path.relpath(os.path.join(d, f), root) for d, dirs, files in os.walk(root)
              for f in files if not any(p.startswith(".") for p in d[len(root):].split(os.sep))]
  return sorted(p for p in listed if p.endswith(SUFFIXES) or os.path.basename(p) == "Makefile")


def faults(root: str) -> list[str]:
  """`path:line: problem` for each reference to a missing section and each old citation."""
  with open(os.path.join(root, "docs", "spec.md"), encoding="utf-8") as f:
    sections = set(spec_sections.headings(f.read()))
  out = []
  for path in text_files(root):
    try:
      with open(os.path.join(root, path), encoding="utf-8") as f:
        text = f.read()
    except (FileNotFoundError, UnicodeDecodeError):
      continue
    for line, section in spec_sections.references(text):
      if section not in sections:
        out.append(f"{path}:{line}: spec §{section} is not a section of docs/spec.md")
    for old in OLD:
      at = text.find(old)
      while at >= 0:
        out.append(f"{path}:{text.count(chr(10), 0, at) + 1}: cites the old {old!r}")
        at = text.find(old, at + 1)
  return out


def test_every_spec_reference_names_a_section_of_docs_spec_md():
  found = faults(ROOT)
  assert not found, "\n" + "\n".join(found)


def test_the_references_are_found():
  """The scan sees the references it is meant to check (a broken parser finds none)."""
  found = set()
  for path in text_files(ROOT):
    if path.startswith("tirjax/"):
      with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        found.update(s for _, s in spec_sections.references(f.read()))
  assert {"2", "3", "4.1", "4.2", "4.3", "4.4", "4.5", "5", "5.1", "6", "6.1", "7", "9"} <= found


def test_the_package_knows_the_headings_of_docs_spec_md():
  """`spec_sections.SECTIONS`, which the estimator registry checks against at run time (the
  package never reads docs/), are the numbered headings of docs/spec.md, in order."""
  with open(SPEC, encoding="utf-8") as f:
    assert spec_sections.headings(f.read()) == spec_sections.SECTIONS


def test_every_registered_section_and_formulas_md_row_exists():
  for name in advantages.names():
    section = advantages.get(name).spec
    assert section is None or section in spec_sections.SECTIONS, name
  with open(os.path.join(ROOT, "docs", "formulas.md"), encoding="utf-8") as f:
    rows = [line.split("|")[1].strip() for line in f if line.startswith("| §")]
  assert rows and all(r.removeprefix("§") in spec_sections.SECTIONS for r in rows), rows


@pytest.mark.parametrize("text, want", [
    ("spec §4.1", ["4.1"]),
    ("(spec §4.1, §5)", ["4.1", "5"]),
    ("spec §4.1-4.3", ["4.1", "4.3"]),
    ("spec §3-4: z", ["3", "4"]),
    ("spec §6, Verdicts", ["6"]),
    ("spec §4.3 / DAPO Eq. 11", ["4.3"]),
    ("spec §6, 10 steps", ["6"]),
    ("PORTool §4, issue 40 §2", []),
    ("a\nb spec §9.", ["9"]),
])
def test_references_in_text(text, want):
  assert [s for _, s in spec_sections.references(text)] == want


def test_a_reference_to_a_missing_section_or_the_old_spec_fails(tmp_path):
  """The faults the scan exists for, injected into a copy of docs/spec.md and a source file."""
  root = tmp_path / "repo"
  (root / "docs").mkdir(parents=True)
  with open(SPEC, encoding="utf-8") as f:
    (root / "docs" / "spec.md").write_text(f.read(), encoding="utf-8")
  (root / "ok.py").write_text('"""Fine (spec §4.1, §5; spec §4.1-4.3)."""\n')
  (root / "bad.py").write_text(f'"""x\n\nA bogus one ({BOGUS})."""\n')
  (root / "old.md").write_text("See " + OLD[0] + "6.\n")
  (root / "data.json").write_text(f'{{"x": "{BOGUS}"}}\n')  # JSON is not scanned
  got = faults(str(root))
  assert got == [f"bad.py:3: {BOGUS} is not a section of docs/spec.md",
                 f"old.md:1: cites the old {OLD[0]!r}"]
