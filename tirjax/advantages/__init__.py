"""Advantage estimators (spec §3-4), chosen by name through the registry.

    from tirjax import advantages
    est = advantages.get("portool")
    out = est(rollouts, est.make_options({"fork_scale": "none"}))

Every module of this package is imported here, in name order, without a list: a module that
registers an estimator (`@register`, `tirjax/advantages/registry.py`) is all it takes to add
one. A folder `<entry>/tirjax/advantages/` under a `sys.path` entry whose `tirjax/` is no package
(no `__init__.py`: a folder of additions, not another checkout) joins this package, so an
estimator may also live outside the repository, as tests/test_new_estimator.py puts one.
"""

import importlib
import pkgutil

from tirjax import plugin_path
from tirjax.advantages.registry import Advantages, Estimator, get, names, register

__path__ = plugin_path.extend(__path__, __name__)
for _module in sorted({m.name for m in pkgutil.iter_modules(__path__)}):
  importlib.import_module(f"{__name__}.{_module}")

__all__ = ["Advantages", "Estimator", "get", "names", "register"]
