"""A study's report on disk: report.md, summary.csv, paired.csv and one PNG per curve."""

from __future__ import annotations

import os
from typing import Optional

from tirjax.reporting import plots, tables
from tirjax.reporting.runs import Study


def _file_name(curve: str) -> str:
  return "curve_" + curve.replace("/", "_") + ".png"


def render_markdown(study: Study, title: Optional[str] = None, figures: list[str] = ()) -> str:
  """The Markdown report: final metrics, paired comparison, problems, figures (and a title)."""
  rows = tables.summarize(study)
  parts = [f"# {title}\n"] if title else []
  parts += ["## Final metrics (mean ± 95% CI half-width over seeds, Student t)\n",
           tables.summary_markdown(study, rows)]
  if any(r.label == study.baseline for r in study.runs):
    paired = tables.compare(study)
    parts += [f"\n## Paired comparison against `{study.baseline}` (by seed)\n",
              tables.paired_markdown(paired, study.baseline)]
    metric = study.metrics[0]
    parts += [f"\n## What this design can detect (`{metric}`)\n",
              tables.power_markdown(paired, metric, study.baseline)]
  else:
    parts.append(f"\nNo `{study.baseline}` runs: no paired comparison.\n")
  parts += ["\n## Runs that did not finish with metrics\n", tables.problems_markdown(study)]
  if figures:
    parts.append("\n## Learning curves\n")
    parts += [f"![{f}]({f})\n" for f in figures]
  return "\n".join(parts)


def write_report(study: Study, out_dir: str, title: str = "tirjax report") -> dict[str, str]:
  """Writes the report files into `out_dir`; returns {kind: path}."""
  os.makedirs(out_dir, exist_ok=True)
  paths = {}
  figures = []
  for curve in study.curves:
    path = os.path.join(out_dir, _file_name(curve))
    if plots.plot_curve(study, curve, path):
      figures.append(os.path.basename(path))
      paths[f"curve:{curve}"] = path
  rows = tables.summarize(study)
  for kind, text in [("report.md", render_markdown(study, title, figures)),
                     ("summary.csv", tables.summary_csv(study, rows)),
                     ("paired.csv", tables.paired_csv(tables.compare(study), study.baseline))]:
    path = os.path.join(out_dir, kind)
    with open(path, "w") as f:
      f.write(text)
    paths[kind] = path
  return paths
