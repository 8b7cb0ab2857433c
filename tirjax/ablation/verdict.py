"""The credit testbed's verdict (issue 37), as `experiments.credit_verdict` writes it: each
cell's greedy-accuracy gain over its warm start, each claim of the prediction against its
comparator (paired t-test), Spearman's rank correlation of the cells' credit fidelity with
their gains (exact permutation p-value up to `EXACT_UP_TO` cells), and each cell's credit
while it trained (`TRAINING_CREDIT`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import scipy.stats

from tirjax.rundir import RunDir
from tirjax.reporting import runs, stats


GAIN = "gain/accuracy"
# Logged at every RL step of a toolworld run (spec §4.5; `tirjax.trainer.rl_metrics`).
TRAINING_CREDIT = (("auc_query", "credit/auc_query"), ("auc_all_fail", "credit/auc_all_fail"),
                   ("wrong_negative", "credit/wrong_negative"),
                   ("collateral_blame", "credit/collateral_blame"),
                   ("free_credit", "credit/free_credit"), ("no_signal", "credit/no_signal"),
                   ("no_signal_all_fail", "credit/no_signal_all_fail"),
                   ("mixed_groups", "groups/mixed_share"))


def gains_by_cell(study_dirs: Sequence[str]) -> dict[str, dict[int, float]]:
  """{cell label: {seed: greedy-accuracy gain}} of the finished RL runs (warm starts left out)."""
  study = runs.load_run_dirs(list(study_dirs))
  out: dict[str, dict[int, float]] = {}
  for run in study.runs:
    if run.state == runs.OK and run.final.get(GAIN) is not None:
      out.setdefault(run.label, {})[run.seed] = float(run.final[GAIN])
  return out


def _mean(values) -> float | None:
  finite = [float(v) for v in values if isinstance(v, (int, float)) and np.isfinite(v)]
  return float(np.mean(finite)) if finite else None


def training_credit(study_dirs: Sequence[str]) -> dict[str, dict[str, float | None]]:
  """{cell label: {measure: mean over seeds of the mean over RL steps}} of the finished RL
  runs, for the measures of `TRAINING_CREDIT` (None where a run logged none)."""
  per_run: dict[str, list[dict]] = {}
  for run in runs.load_run_dirs(list(study_dirs)).runs:
    if run.state != runs.OK or run.final.get(GAIN) is None:
      continue
    rl = RunDir(run.source).metrics("rl")
    per_run.setdefault(run.label, []).append(
        {name: _mean(line.get(key) for line in rl) for name, key in TRAINING_CREDIT})
  return {label: {name: _mean(r[name] for r in rows) for name, _ in TRAINING_CREDIT}
          for label, rows in sorted(per_run.items())}


def fidelity_of(result: dict, measure: str) -> dict[str, float]:
  """Each estimator's `measure` on its own rollouts, from a `credit_fidelity` result."""
  return {name: result["estimators"][kind][name]["measures"][measure]
          for name, kind in result["own"].items()
          if result["estimators"][kind][name]["measures"][measure] is not None}


EXACT_UP_TO = 8  # cells: every pairing enumerated (8! = 40,320), else 100,000 drawn


def spearman(x: Sequence[float], y: Sequence[float]) -> dict:
  """Spearman's ρ and its two-sided permutation p-value: the share of the pairings of `y` with
  `x` whose |ρ| is at least the observed one, exact up to `EXACT_UP_TO` cells. (scipy's
  default p comes from a t approximation that says p = 0 for a perfect ρ on 3 cells, where
  the exact p is 1/3.)"""
  rho = scipy.stats.spearmanr(x, y).statistic
  if len(x) < 3 or np.isnan(rho):
    return {"rho": None if np.isnan(rho) else float(rho), "p_value": None, "n": len(x)}
  test = scipy.stats.permutation_test(
      (np.asarray(x, float), np.asarray(y, float)),
      lambda a, b: scipy.stats.spearmanr(a, b).statistic, permutation_type="pairings",
      n_resamples=np.inf if len(x) <= EXACT_UP_TO else 100_000, alternative="two-sided",
      rng=np.random.default_rng(0))
  return {"rho": float(rho), "p_value": float(test.pvalue), "n": len(x)}


def verdict(gains: dict[str, dict[int, float]], prediction: dict, fidelity: dict) -> dict:
  cells = {}
  for label, by_seed in sorted(gains.items()):
    ci = stats.mean_ci(list(by_seed.values()))
    cells[label] = {"seeds": sorted(by_seed), "gain": ci.mean, "ci95": [ci.low, ci.high]}
  claims = []
  for claim in prediction["claims"]:
    a, b = gains.get(claim["cell"], {}), gains.get(claim["vs"], {})
    seeds = sorted(set(a) & set(b))
    p = stats.paired([a[s] for s in seeds], [b[s] for s in seeds])
    held = (p.diff.mean is not None and p.p_value is not None
            and p.diff.mean >= claim["at_least"] and p.diff.mean > 0 and p.p_value < 0.05)
    claims.append({**claim, "seeds": seeds, "difference": p.diff.mean,
                   "ci95": [p.diff.low, p.diff.high], "p_value": p.p_value, "sd": p.sd,
                   "detectable": stats.detectable_difference(p.sd, p.n), "held": held})
  measure = prediction.get("measure", "auc")
  fid = fidelity_of(fidelity, measure)
  both = [c for c in cells if c in fid and cells[c]["gain"] is not None]
  predicted = [c for c in prediction.get("order", []) if c in cells]
  return {"cells": cells, "claims": claims,
          "fidelity_measure": measure, "fidelity": {c: fid[c] for c in both},
          "spearman_fidelity_gain": spearman([fid[c] for c in both],
                                             [cells[c]["gain"] for c in both]),
          "spearman_predicted_order_gain": spearman(
              list(range(len(predicted), 0, -1)), [cells[c]["gain"] for c in predicted])}


def markdown(result: dict) -> str:
  lines = ["# Credit testbed: the ablation against its prediction\n",
           f"Prediction: `{result['prediction_path']}` (written before training); fidelity: "
           f"`{result['fidelity_path']}`.\n", "| cell | seeds | greedy gain | 95% CI |",
           "| --- | ---: | ---: | --- |"]
  for label, c in result["cells"].items():
    lo, hi = c["ci95"]
    ci = f"[{lo:+.3f}, {hi:+.3f}]" if lo is not None else "n/a"
    lines.append(f"| {label} | {len(c['seeds'])} | {c['gain']:+.3f} | {ci} |")
  lines += ["", "| claim | at least | predicted to hold | measured (paired) | p | detectable at "
                "80% power | held |", "| --- | ---: | --- | --- | ---: | ---: | --- |"]
  for c in result["claims"]:
    d = "n/a" if c["difference"] is None else (
        f"{c['difference']:+.3f} [{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}]"
        if c["ci95"][0] is not None else f"{c['difference']:+.3f}")
    p = "n/a" if c["p_value"] is None else f"{c['p_value']:.3f}"
    det = "n/a" if c["detectable"] is None else f"{c['detectable']:.3f}"
    predicted = {True: "yes", False: "no"}.get(c.get("predicted_to_hold"), "–")
    lines.append(f"| {c['cell']} − {c['vs']} | {c['at_least']:+.3f} | {predicted} | {d} | {p} | "
                 f"{det} | {'yes' if c['held'] else 'no'} |")
  s, o = result["spearman_fidelity_gain"], result["spearman_predicted_order_gain"]
  fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
  if result.get("training_credit"):
    names = [name for name, _ in TRAINING_CREDIT]
    lines += ["", "Credit while training (each cell's RL steps, the mean over steps, then over "
                  "seeds; `credit/*` and `groups/mixed_share`):", "",
              "| cell | " + " | ".join(names) + " |", "| --- |" + " ---: |" * len(names)]
    for label, m in result["training_credit"].items():
      lines.append(f"| {label} | " + " | ".join(fmt(m[n]) for n in names) + " |")
  lines += ["", f"Spearman ρ between the cells' fidelity ({result['fidelity_measure']}, own "
                f"rollouts) and their mean gains: {fmt(s['rho'])} (p = {fmt(s['p_value'])}, "
                f"{s['n']} cells); between the predicted order and the gains: {fmt(o['rho'])} "
                f"(p = {fmt(o['p_value'])})."]
  return "\n".join(lines) + "\n"
