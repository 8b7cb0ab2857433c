"""Learning curves of a `Study`: per cell, the mean over seeds with a 95% CI band.

Seeds are aligned by their x values (trainer step, or bench episodes); at an x that fewer
than two seeds reached the mean is drawn without a band. Failed and running runs are plotted
too (their curves are data up to where they stopped); the legend counts the seeds.
"""

from __future__ import annotations

import collections
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from tirjax.reporting import stats  # noqa: E402
from tirjax.reporting.runs import Study  # noqa: E402


def band(curves: list[tuple[list, list]], level: float = 0.95):
  """(x, mean, low, high) over seeds' (x, y) curves; low/high are None where n < 2."""
  by_x = collections.defaultdict(list)
  for xs, ys in curves:
    for x, y in zip(xs, ys):
      by_x[x].append(y)
  xs = sorted(by_x)
  intervals = [stats.mean_ci(by_x[x], level) for x in xs]
  return (xs, [iv.mean for iv in intervals], [iv.low for iv in intervals],
          [iv.high for iv in intervals])


def plot_curve(study: Study, name: str, path: str, level: float = 0.95) -> bool:
  """One PNG of curve `name` for every cell that has it; False if no run has it."""
  labels = [lab for lab in study.labels()
            if any(r.curves.get(name, ([], []))[0] for r in study.runs if r.label == lab)]
  if not labels:
    return False
  fig, ax = plt.subplots(figsize=(9, 5))
  colors = plt.get_cmap("tab20").colors
  for i, label in enumerate(labels):
    runs = [r for r in study.runs if r.label == label and r.curves.get(name, ([], []))[0]]
    xs, mean, low, high = band([r.curves[name] for r in runs], level)
    color = colors[i % len(colors)]
    ax.plot(xs, mean, color=color, lw=1.5, label=f"{label} (seeds={len(runs)})")
    spans = [(x, lo, hi) for x, lo, hi in zip(xs, low, high) if lo is not None]
    if spans:
      bx, blo, bhi = zip(*spans)
      ax.fill_between(bx, blo, bhi, color=color, alpha=0.2, lw=0)
  ax.set_xlabel(study.x_label)
  ax.set_ylabel(name)
  ax.set_title(f"{name}: mean over seeds, {level:.0%} CI band")
  ax.grid(alpha=0.3)
  ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
  fig.tight_layout()
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return True
