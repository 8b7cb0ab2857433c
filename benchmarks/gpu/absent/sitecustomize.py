"""Makes the packages that the GPU machine's image lacks absent here (`make test-compat`).

On PYTHONPATH, Python imports this at start-up. Each top-level name in $TIRJAX_ABSENT
(comma-separated) is then found only outside the interpreter's own site-packages (as from
benchmarks/gpu/run.sh's .whl/ folder, which the GPU run installs), never inside it, so an
import that the image could not satisfy fails here as it would there.
"""

import importlib.abc
import importlib.machinery
import os
import site
import sys

ABSENT = frozenset(n for n in os.environ.get("TIRJAX_ABSENT", "").split(",") if n)


class AbsentFinder(importlib.abc.MetaPathFinder):
  """Finds the names in ABSENT only on the path entries outside site-packages."""

  def __init__(self):
    self.site = {os.path.realpath(p) for p in site.getsitepackages() + [site.getusersitepackages()]}

  def find_spec(self, name, path=None, target=None):
    del target
    if path is not None or name not in ABSENT:
      return None  # submodules follow their package; other names as usual
    outside = [p for p in sys.path if os.path.realpath(p or ".") not in self.site]
    spec = importlib.machinery.PathFinder.find_spec(name, outside)
    if spec is None:
      raise ModuleNotFoundError(f"No module named {name!r} (absent from the GPU image: "
                                "TIRJAX_ABSENT)", name=name)
    return spec


if ABSENT:
  sys.meta_path.insert(0, AbsentFinder())
