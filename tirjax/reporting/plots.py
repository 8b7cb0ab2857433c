"""Learning curves of a `Study`: per cell, the mean over seeds with a 95% CI.

Seeds are aligned by their x values (trainer step, or bench episodes); at an x that fewer
than two seeds reached the mean is drawn without an interval. Failed and running runs are
plotted too (their curves are data up to where they stopped); the legend counts the seeds.

Made to be read at a glance:
* every cell has its own colour (a qualitative palette without light/dark pairs), the same in
  every figure of a study (from the cell's place among all the study's cells, not among those
  that have the curve), and cells beyond the palette get a dashed line as well;
* a short series (at most `SHORT` points, e.g. one evaluation per run) is drawn with markers
  and error bars, so that a single point is visible;
* with more than `MAX_OVERLAID` cells, the figure becomes small multiples: one panel per cell
  against the baseline cell (grey), on shared axes;
* where every cell has a single point (one evaluation per run), a line plot shows nothing: the
  figure is then a point-range chart, one column per cell, the baseline's mean as a grey line.
"""

from __future__ import annotations

import collections
import math
import os
from typing import Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from tirjax.reporting import stats  # noqa: E402
from tirjax.reporting.runs import Study  # noqa: E402

SHORT = 12  # series with at most this many points get markers and error bars
MAX_OVERLAID = 6  # more cells than this: small multiples against the baseline
# Tableau's 10 (its grey, the baseline's colour, made teal) plus black and gold: 12 colours, none
# a lighter copy of another.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#00786c", "#bcbd22", "#17becf", "#000000", "#e6ab02")
BASELINE_COLOR = "#9a9a9a"


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


def style(index: int) -> dict:
  """Colour (and, past the palette, line style) of the index-th cell."""
  return {"color": PALETTE[index % len(PALETTE)],
          "linestyle": ("-", "--", ":")[(index // len(PALETTE)) % 3]}


def draw(ax, xs, mean, low, high, label: str, color: str, linestyle: str = "-",
         lw: float = 1.5, alpha: float = 0.2) -> None:
  """One cell's mean with its interval: a band for a long series, error bars for a short one."""
  short = len(xs) <= SHORT
  ax.plot(xs, mean, color=color, linestyle=linestyle, lw=lw, label=label,
          marker="o" if short else None, markersize=4)
  spans = [(x, m, lo, hi) for x, m, lo, hi in zip(xs, mean, low, high) if lo is not None]
  if not spans:
    return
  bx, bm, blo, bhi = zip(*spans)
  if short:
    ax.errorbar(bx, bm, yerr=[[m - lo for m, lo in zip(bm, blo)], [hi - m for m, hi in zip(bm, bhi)]],
                fmt="none", ecolor=color, elinewidth=1, capsize=3)
  else:
    ax.fill_between(bx, blo, bhi, color=color, alpha=alpha, lw=0)


def plot_curve(study: Study, name: str, path: str, level: float = 0.95,
               baseline: Optional[str] = None) -> bool:
  """One PNG of curve `name` for every cell that has it; False if no run has it.

  `baseline` (default: the study's) is the cell every small-multiple panel shows in grey.
  """
  fig = figure(study, name, level, baseline)
  if fig is None:
    return False
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return True


def figure(study: Study, name: str, level: float = 0.95, baseline: Optional[str] = None):
  """The matplotlib figure of `plot_curve` (None if no run has the curve)."""
  labels = [lab for lab in study.labels()
            if any(r.curves.get(name, ([], []))[0] for r in study.runs if r.label == lab)]
  if not labels:
    return None
  series = {}
  for label in labels:
    runs = [r for r in study.runs if r.label == label and r.curves.get(name, ([], []))[0]]
    series[label] = (band([r.curves[name] for r in runs], level), len(runs))
  baseline = baseline or study.baseline
  styles = {label: style(i) for i, label in enumerate(study.labels())}
  if all(len(xs) == 1 for (xs, *_), _ in series.values()):
    return _point_ranges(series, labels, styles, baseline, study.x_label, name, level)
  if len(labels) > MAX_OVERLAID:
    return _small_multiples(series, labels, styles, baseline, study.x_label, name, level)
  return _overlaid(series, labels, styles, study.x_label, name, level)


def _overlaid(series, labels, styles, x_label, name, level):
  fig, ax = plt.subplots(figsize=(9, 5))
  for label in labels:
    (xs, mean, low, high), seeds = series[label]
    draw(ax, xs, mean, low, high, f"{label} (seeds={seeds})", **styles[label])
  ax.set_xlabel(x_label)
  ax.set_ylabel(name)
  ax.set_title(f"{name}: mean over seeds, {level:.0%} CI")
  ax.grid(alpha=0.3)
  ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
  fig.tight_layout()
  return fig


def _small_multiples(series, labels, styles, baseline, x_label, name, level):
  panels = [lab for lab in labels if lab != baseline] if baseline in series else list(labels)
  cols = min(4, len(panels))
  rows = math.ceil(len(panels) / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.6 * rows + 0.8), sharex=True,
                           sharey=True, squeeze=False)
  for i, label in enumerate(panels):
    ax = axes[i // cols][i % cols]
    if baseline in series:
      (xs, mean, low, high), _ = series[baseline]
      draw(ax, xs, mean, low, high, baseline, BASELINE_COLOR, lw=1.2, alpha=0.25)
    (xs, mean, low, high), seeds = series[label]
    draw(ax, xs, mean, low, high, label, **styles[label])
    ax.set_title(f"{label} (seeds={seeds})", fontsize=9)
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=8)
  for j in range(len(panels), rows * cols):
    axes[j // cols][j % cols].axis("off")
  for ax in axes[-1]:
    ax.set_xlabel(x_label, fontsize=8)
  for row in axes:
    row[0].set_ylabel(name, fontsize=8)
  against = f" against {baseline} (grey)" if baseline in series else ""
  fig.suptitle(f"{name}: mean over seeds, {level:.0%} CI, each cell{against}", fontsize=11)
  fig.tight_layout()
  return fig


def _point_ranges(series, labels, styles, baseline, x_label, name, level):
  fig, ax = plt.subplots(figsize=(max(5.0, 0.75 * len(labels) + 2.0), 4.5))
  at = sorted({xs[0] for (xs, *_), _ in series.values()})
  for i, label in enumerate(labels):
    (xs, mean, low, high), _ = series[label]
    color = BASELINE_COLOR if label == baseline else styles[label]["color"]
    ax.plot([i], mean, "o", color=color, markersize=6)
    if low[0] is not None:
      ax.errorbar([i], mean, yerr=[[mean[0] - low[0]], [high[0] - mean[0]]], fmt="none",
                  ecolor=color, elinewidth=1.5, capsize=4)
  if baseline in series:
    ax.axhline(series[baseline][0][1][0], color=BASELINE_COLOR, lw=1, ls="--",
               label=f"{baseline} mean")
    ax.legend(fontsize=8)
  ax.set_xticks(range(len(labels)))
  ax.set_xticklabels([f"{lab}\n(n={series[lab][1]})" for lab in labels], rotation=45,
                     ha="right", fontsize=8)
  ax.set_ylabel(name)
  where = ", ".join(str(x) for x in at)
  ax.set_title(f"{name} at {x_label} {where}: mean over seeds, {level:.0%} CI")
  ax.grid(alpha=0.3, axis="y")
  fig.tight_layout()
  return fig
