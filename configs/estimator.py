"""Any registered estimator, on the protocol its registration gives (the generic path).

    python -m experiments.train --config=configs/estimator.py:grpo,model=tiny --workdir=runs/grpo

The argument is the estimator's name, then the presets of configs/base.py. An estimator with a
config file of its own (`configs/<name>.py`, for what its registration cannot say, e.g. DAPO's
overlong lengths) gets that file's config; any other gets `base.estimator_config`: its
protocol (`portool` or `hidifftir`, configs/base.py) with its paper's rollout and loss settings
(`register(..., rollout=..., loss=...)`, tirjax/advantages/registry.py). So a new estimator has a
config, and joins the ablation grids (`tirjax.ablation.grid` falls back to this file), without
a config file.
"""

import importlib
import os

from configs import base
from tirjax import advantages


def split_arg(arg: str | None) -> tuple[str, str | None]:
  """`"<estimator>[,presets]"` -> (estimator, presets or None); an unknown name fails listing
  the registered ones."""
  name, _, presets = (arg or "").partition(",")
  if name not in advantages.names():
    raise ValueError(f"configs/estimator.py: the argument starts with a registered estimator's "
                     f"name (e.g. configs/estimator.py:grpo,model=tiny), got {arg!r}; "
                     f"registered: {advantages.names()}")
  return name, presets or None


def own_file(name: str) -> str:
  """The path of `configs/<name>.py` (it may not exist)."""
  return os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")


def get_config(arg=None):
  name, presets = split_arg(arg)
  if os.path.isfile(own_file(name)):
    return importlib.import_module(f"configs.{name}").get_config(presets)
  return base.estimator_config(presets, name)
