"""The package's import graph (issue 39): no circle, counting imports inside functions too (a
lazy import that closes a circle only hides it), and neither the package nor a test imports
the entry points (`experiments`, `benchmarks`): what a test needs lives in the package."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _modules(root: pathlib.Path) -> dict[str, pathlib.Path]:
  out = {}
  for path in (root / "tirjax").rglob("*.py"):
    name = ".".join(path.relative_to(root).with_suffix("").parts)
    out[name.removesuffix(".__init__")] = path
  return out


def _imports(path: pathlib.Path, mods=()) -> set[str]:
  """Every module named by an import anywhere in the file (functions included):
  `from p import m` names the module p.m where there is one, else p."""
  names = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      for a in node.names:
        sub = f"{node.module}.{a.name}"
        names.add(sub if sub in mods else node.module)
    elif isinstance(node, ast.Import):
      names.update(a.name for a in node.names)
  return names


def import_graph(root: pathlib.Path) -> dict[str, set[str]]:
  mods = _modules(root)
  return {m: {d for d in _imports(p, mods) if d in mods and d != m} for m, p in mods.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

  def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


def test_the_package_has_no_import_circle():
  graph = import_graph(ROOT)
  assert len(graph) > 100  # the walk found the package
  assert circles(graph) == []


def test_circles_finds_a_lazy_import_circle():
  """The check sees a circle closed by an import inside a function."""
  graph = {"a": {"b"}, "b": set(), "c": set()}
  assert circles(graph) == []
  graph["b"].add("a")
  assert circles(graph) == [["a", "b"]]


def test_function_level_imports_count(tmp_path):
  pkg = tmp_path / "tirjax"
  pkg.mkdir()
  (pkg / "__init__.py").write_text("")
  (pkg / "one.py").write_text("from tirjax import two\n")
  (pkg / "two.py").write_text("def f():\n  from tirjax import one\n")
  assert circles(import_graph(tmp_path)) == [["tirjax.one", "tirjax.two"]]


ENTRY_POINTS = ("experiments", "benchmarks")


def _entry_point_users(paths) -> list[str]:
  return sorted(str(p.relative_to(ROOT)) for p in paths
                if any(d.split(".")[0] in ENTRY_POINTS for d in _imports(p)))


def test_the_package_does_not_import_the_entry_points():
  assert _entry_point_users(_modules(ROOT).values()) == []


def test_no_test_imports_the_entry_points():
  """Issue 39: a test runs an entry point as a user does (a subprocess) or tests the package
  function behind it."""
  tests = sorted((ROOT / "tests").rglob("*.py"))
  assert len(tests) > 50
  assert _entry_point_users(tests) == []


def test_an_entry_point_import_is_seen(tmp_path):
  for i, line in enumerate(("from experiments import evaluate", "import benchmarks.bench_update",
                            "def f():\n  from experiments.studies import step_time")):
    (tmp_path / f"t{i}.py").write_text(line + "\n")
  found = [d for p in sorted(tmp_path.glob("*.py")) for d in _imports(p)]
  assert [d.split(".")[0] for d in found] == ["experiments", "benchmarks", "experiments"]


# A run directory's own files (`tirjax.rundir`): not "config.json" (a Hugging Face file name
# too) nor "reference" (also a timed phase's name).
RUN_FILES = ("cell.json", "status.json", "metrics.jsonl", "eval_after_sft.json", "summary.json",
             "checkpoints", "hf_export")


def _string_constants(path: pathlib.Path) -> set[str]:
  return {n.value for n in ast.walk(ast.parse(path.read_text()))
          if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def test_a_run_directory_s_files_are_named_in_rundir_only():
  """Issue 39: one module names every file of a run directory (writers and readers use its
  names); a literal elsewhere would be a second home."""
  files = [*(ROOT / "tirjax").rglob("*.py"), *(ROOT / "experiments").rglob("*.py"),
           *(ROOT / "benchmarks").rglob("*.py")]
  named = {str(p.relative_to(ROOT)): sorted(_string_constants(p) & set(RUN_FILES))
           for p in files if p != ROOT / "tirjax" / "rundir.py"}
  assert {p: n for p, n in named.items() if n} == {}
  assert set(RUN_FILES) <= _string_constants(ROOT / "tirjax" / "rundir.py")
