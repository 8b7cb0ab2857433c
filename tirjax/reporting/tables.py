"""Tables of a `Study`: final metrics per cell (mean ± 95% CI over seeds) and paired
comparisons against the baseline cell, as Markdown and CSV.

Every cell label of the study gets a row, with a status that counts its runs by state, so a
failed, running or metric-less cell shows as such instead of disappearing. Metrics a run did
not report are left out of that metric's n, which the tables print.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import io
from typing import Optional

from tirjax.reporting import stats
from tirjax.reporting.runs import Study


@dataclasses.dataclass(frozen=True)
class SummaryRow:
  label: str
  runs: int
  ok: int
  status: str  # "ok", or e.g. "3/5 ok; failed: seed 2; running: seed 4"
  metrics: dict  # metric -> stats.Interval over the ok runs that report it


@dataclasses.dataclass(frozen=True)
class PairedRow:
  label: str
  metric: str
  result: Optional[stats.Paired]  # None: no seed that both cells finished
  note: str = ""


def _status(runs) -> str:
  ok = sum(r.ok for r in runs)
  if ok == len(runs):
    return "ok"
  bad = collections.defaultdict(list)
  for r in runs:
    if not r.ok:
      bad[r.state].append(str(r.seed))
  detail = "; ".join(f"{state}: seed {', '.join(seeds)}" for state, seeds in sorted(bad.items()))
  return f"{ok}/{len(runs)} ok; {detail}"


def summarize(study: Study, level: float = 0.95) -> list[SummaryRow]:
  """One row per cell label: the status of its runs and each metric's mean with its CI."""
  rows = []
  for label in study.labels():
    runs = [r for r in study.runs if r.label == label]
    ok = [r for r in runs if r.ok]
    metrics = {m: stats.mean_ci([r.final[m] for r in ok if r.final.get(m) is not None], level)
               for m in study.metrics}
    rows.append(SummaryRow(label, len(runs), len(ok), _status(runs), metrics))
  return rows


def compare(study: Study, level: float = 0.95) -> list[PairedRow]:
  """Each cell against the baseline, paired by seed over the seeds both finished."""
  base = {r.seed: r for r in study.runs if r.label == study.baseline and r.ok}
  out = []
  for label in study.labels():
    if label == study.baseline:
      continue
    runs = {r.seed: r for r in study.runs if r.label == label and r.ok}
    for m in study.metrics:
      seeds = sorted(s for s in runs.keys() & base.keys()
                     if runs[s].final.get(m) is not None and base[s].final.get(m) is not None)
      if not seeds:
        note = ("no finished baseline run" if not base else "no finished run" if not runs
                else "no seed where both report it")
        out.append(PairedRow(label, m, None, note))
        continue
      out.append(PairedRow(label, m, stats.paired([runs[s].final[m] for s in seeds],
                                                  [base[s].final[m] for s in seeds], level)))
  return out


def fmt(x: Optional[float], like: Optional[float] = None) -> str:
  """A number for a table: n/a for None; no decimals when `like` (default: x itself) is 100
  or more in magnitude, else 3 decimals."""
  if x is None:
    return "n/a"
  return f"{x:.0f}" if abs(x if like is None else like) >= 100 else f"{x:.3f}"


def _cell(iv: stats.Interval) -> str:
  if iv.n == 0:
    return "—"
  half = iv.half_width
  if half is None:
    return f"{fmt(iv.mean)} (n=1)"
  return f"{fmt(iv.mean)} ± {fmt(half, like=max(abs(iv.mean), half))} (n={iv.n})"


def summary_markdown(study: Study, rows: list[SummaryRow]) -> str:
  metrics = [m for m in study.metrics if any(r.metrics[m].n for r in rows)]
  head = ["cell", "runs", "status", *metrics]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in rows:
    lines.append("| " + " | ".join([r.label, str(r.runs), r.status,
                                    *(_cell(r.metrics[m]) for m in metrics)]) + " |")
  return "\n".join(lines) + "\n"


def paired_markdown(rows: list[PairedRow], baseline: str) -> str:
  head = ["cell", "metric", "n", f"mean − {baseline}", "95% CI", "p (paired t)"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in rows:
    if r.result is None:
      lines.append(f"| {r.label} | {r.metric} | 0 | — | — | {r.note} |")
      continue
    d = r.result.diff
    scale = max(abs(v) for v in (d.mean, d.low, d.high) if v is not None)
    ci = "n/a" if d.low is None else f"[{fmt(d.low, scale)}, {fmt(d.high, scale)}]"
    p = "n/a" if r.result.p_value is None else f"{r.result.p_value:.3g}"
    lines.append(f"| {r.label} | {r.metric} | {r.result.n} | {fmt(d.mean, scale)} | {ci} | {p} |")
  return "\n".join(lines) + "\n"


def power_markdown(rows: list[PairedRow], metric: str, baseline: str, alpha: float = 0.05,
                   power: float = 0.8) -> str:
  """What the design can detect on `metric`: from the paired differences against the baseline,
  their pooled standard deviation, the smallest difference a paired t-test over these seeds
  detects (level α, power), and which cells separate; a plain verdict when none does."""
  found = [r for r in rows if r.metric == metric and r.result is not None and r.result.n >= 2]
  if not found:
    return f"No paired differences on `{metric}`: power not computed.\n"
  n = min(r.result.n for r in found)
  spreads = [r.result.sd for r in found if r.result.sd is not None]
  sd = (sum(x * x for x in spreads) / len(spreads)) ** 0.5 if spreads else None
  mde = stats.detectable_difference(sd, n, alpha, power)
  separated = [r.label for r in found if r.result.p_value is not None and r.result.p_value < alpha]
  lines = [f"Pooled standard deviation of the paired differences on `{metric}` over {n} seeds: "
           f"{fmt(sd)}. With {n} seeds a paired t-test (α = {alpha}, power {power:.0%}) detects "
           f"a true difference of {fmt(mde)} or more; smaller ones are within noise."]
  if separated:
    lines.append(f"Cells that differ from `{baseline}` at p < {alpha}: {', '.join(separated)} "
                 f"(uncorrected for the {len(found)} comparisons).")
  else:
    lines.append(f"**No cell separates from `{baseline}` on `{metric}`** (every paired p ≥ {alpha}).")
  for delta in (0.05, 0.02):
    need = stats.seeds_needed(sd, delta, alpha, power)
    if need is not None:
      lines.append(f"Detecting a difference of {delta} would take about {need} seeds at this "
                   "spread (or a larger RL budget that widens the differences).")
  return "\n\n".join(lines) + "\n"


def problems_markdown(study: Study) -> str:
  """Runs that are not ok, with their state, error and source."""
  bad = [r for r in study.runs if not r.ok]
  if not bad:
    return "All runs finished with metrics.\n"
  lines = ["| cell | seed | state | error | source |", "|---|---|---|---|---|"]
  for r in bad:
    error = (r.error or "").replace("|", "/").replace("\n", " ")[:200]
    lines.append(f"| {r.label} | {r.seed} | {r.state} | {error} | {r.source} |")
  return "\n".join(lines) + "\n"


def summary_csv(study: Study, rows: list[SummaryRow]) -> str:
  out = io.StringIO()
  w = csv.writer(out)
  w.writerow(["cell", "runs", "ok", "status", "metric", "n", "mean", "ci_low", "ci_high"])
  for r in rows:
    for m in study.metrics:
      iv = r.metrics[m]
      w.writerow([r.label, r.runs, r.ok, r.status, m, iv.n, _raw(iv.mean), _raw(iv.low),
                  _raw(iv.high)])
  return out.getvalue()


def paired_csv(rows: list[PairedRow], baseline: str) -> str:
  out = io.StringIO()
  w = csv.writer(out)
  w.writerow(["cell", "baseline", "metric", "n", "mean_diff", "ci_low", "ci_high", "p_value",
              "note"])
  for r in rows:
    if r.result is None:
      w.writerow([r.label, baseline, r.metric, 0, "", "", "", "", r.note])
      continue
    d = r.result.diff
    w.writerow([r.label, baseline, r.metric, r.result.n, _raw(d.mean), _raw(d.low), _raw(d.high),
                _raw(r.result.p_value), r.note])
  return out.getvalue()


def _raw(x: Optional[float]) -> str:
  return "" if x is None else repr(float(x))
