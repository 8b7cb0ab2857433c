"""Folders of additions to a package: `<entry>/tirjax/<sub>/` under a `sys.path` entry whose
`tirjax/` holds no `__init__.py`.

`tirjax.advantages` and `tirjax.testing.reference` take such folders into their `__path__`, so
an estimator and its reference can be added from outside the repository (a user's own folder
on PYTHONPATH; tests/test_new_estimator.py's throwaway estimator). Unlike
`pkgutil.extend_path`, a `tirjax/` that is a package (another checkout of the repository on
`sys.path`) is never taken: its modules would silently shadow or add to this checkout's.
"""

from __future__ import annotations

import os
import sys


def extend(path: list[str], name: str) -> list[str]:
  """`path` (a package's `__path__`) and each addition folder of package `name`, in `sys.path`
  order, each once."""
  parts = name.split(".")
  out = list(path)
  seen = {os.path.realpath(p) for p in path}
  for entry in sys.path:
    root = os.path.join(entry or os.curdir, parts[0])
    folder = os.path.realpath(os.path.join(root, *parts[1:]))
    if (os.path.isdir(folder) and folder not in seen
        and not os.path.isfile(os.path.join(root, "__init__.py"))):
      seen.add(folder)
      out.append(folder)
  return out
