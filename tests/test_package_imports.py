"""The package's import graph (issue 39): no circle, counting imports inside functions too (a
lazy import that closes a circle only hides it), and neither the package nor a test imports
the entry points (`experiments`, `benchmarks`): what a test needs lives in the package.
Issue 57: every import points down the layers that README's drawing (`### Layers`) shows."""

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


def unit(module: str) -> str:
  """The box of the layer drawing a module belongs to: `tirjax.trainer.stages` -> "trainer",
  `tirjax.rollouts` -> "rollouts"; "" for the package's own `__init__`."""
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else ""


def drawn_layers(readme: str) -> list[list[str]]:
  """The layers of the drawing under README's `### Layers` heading, bottom first: each line of
  its first fenced block is a layer, its boxes separated by " · "."""
  block = readme.split("\n### Layers\n", 1)[1].split("```", 2)[1]
  rows = [line.strip() for line in block.splitlines() if line.strip()]
  return [[box.strip() for box in row.split(" · ")] for row in reversed(rows)]


def wrong_way_imports(graph: dict[str, set[str]], layers: list[list[str]]) -> list[str]:
  """Each import from one box to another that does not point to a lower layer (an import
  within a box is its own affair), as "module -> module (box layer i -> box layer j)". The
  package's own `__init__` (box "") sits above every layer: it re-exports from below."""
  level = {box: i for i, layer in enumerate(layers) for box in layer}
  level[""] = len(layers)
  out = []
  for m in sorted(graph):
    for d in sorted(graph[m]):
      a, b = unit(m), unit(d)
      if a != b and level[b] >= level[a]:
        out.append(f"{m} -> {d} ({a} layer {level[a]} -> {b} layer {level[b]})")
  return out


def test_the_drawing_names_every_box_once():
  layers = drawn_layers((ROOT / "README.md").read_text())
  boxes = [box for layer in layers for box in layer]
  assert len(boxes) == len(set(boxes)), boxes
  assert set(boxes) == {unit(m) for m in _modules(ROOT)} - {""}


def test_no_import_points_up_or_sideways():
  """Issue 57: the layers of the drawing hold, imports inside functions included."""
  graph = import_graph(ROOT)
  assert wrong_way_imports(graph, drawn_layers((ROOT / "README.md").read_text())) == []


def test_an_upward_import_is_seen(tmp_path):
  """The check fails on an import from a lower box to a higher one, inside a function too,
  and on one between boxes of the same layer."""
  pkg = tmp_path / "tirjax"
  (pkg / "high").mkdir(parents=True)
  for path in (pkg / "__init__.py", pkg / "high" / "__init__.py", pkg / "side.py"):
    path.write_text("")
  (pkg / "low.py").write_text("import math\n")
  (pkg / "high" / "top.py").write_text("from tirjax import low\n")
  layers = [["low", "side"], ["high"]]
  assert wrong_way_imports(import_graph(tmp_path), layers) == []
  (pkg / "low.py").write_text("def f():\n  from tirjax.high import top\n")
  assert wrong_way_imports(import_graph(tmp_path), layers) == [
      "tirjax.low -> tirjax.high.top (low layer 0 -> high layer 1)"]
  (pkg / "low.py").write_text("from tirjax import side\n")
  assert wrong_way_imports(import_graph(tmp_path), layers) == [
      "tirjax.low -> tirjax.side (low layer 0 -> side layer 0)"]


def test_drawn_layers_reads_the_drawing():
  text = "intro\n### Layers\n\nwords\n\n```\n      top\n  a · b\n```\n\n```\nnot this\n```\n"
  assert drawn_layers(text) == [["a", "b"], ["top"]]


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
