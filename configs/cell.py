"""One run of an ablation grid: its config, rebuilt from the recipe in the run's cell.json.

    python -m experiments.train --config=configs/cell.py:runs/ablate/grpo/seed0 \\
        --workdir=runs/ablate/grpo/seed0

`experiments.ablate` runs every run of a grid with this command (each train.log starts with
it); run it by hand to continue or redo one run. The argument is a run directory prepared by
the grid (`tirjax.ablation`); the run writes that directory as `experiments.train` always does.
"""

import json
import os

from tirjax.ablation.grid import Recipe, build_config


def get_config(arg=None):
  if not arg:
    raise ValueError("configs/cell.py: the argument is a run directory prepared by "
                     "experiments.ablate, e.g. configs/cell.py:runs/ablate/grpo/seed0")
  path = os.path.join(arg, "cell.json")
  with open(path) as f:
    cell = json.load(f)
  if "recipe" not in cell:
    raise ValueError(f"{path}: no recipe (not a run prepared by experiments.ablate)")
  return build_config(Recipe.from_json(cell["recipe"]))
