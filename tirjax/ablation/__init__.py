"""Ablation grids: estimators × options × seeds as trainer runs, resumable, with a report.

    from tirjax import ablation
    jobs = ablation.plan(grid_config, "runs/ablate")      # every config checked, nothing run
    results = ablation.run_grid(jobs, "runs/ablate", command=..., parallel=2)
    ablation.write_report(jobs, "runs/ablate", baseline="grpo", last_rl=5, title="...")

`experiments/ablate.py` is the command line; `configs/ablate.py` the grid. Modules: `grid`
(labels, recipes, warm starts, checks), `runner` (run directories, processes, report).
"""

from tirjax.ablation.grid import (GridError, Job, Recipe, assign, build_config, parse_label,
                                  plan)
from tirjax.ablation.runner import Result, prepare, run_grid, run_state, write_report

__all__ = ["GridError", "Job", "Recipe", "Result", "assign", "build_config", "parse_label", "plan",
           "prepare", "run_grid", "run_state", "write_report"]
