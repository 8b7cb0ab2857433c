"""The credit testbed's verdict: claims checked by the paired t-test over seeds, and the rank
correlation of fidelity with gains (against scipy)."""

import itertools
import json

import numpy as np
import pytest
import scipy.stats

from tirjax.ablation.verdict import markdown, spearman, training_credit, verdict
from tirjax import rundir

GAINS = {"grpo": {0: 0.10, 1: 0.12, 2: 0.08, 3: 0.11, 4: 0.09},
         "hidifftir": {0: 0.20, 1: 0.21, 2: 0.19, 3: 0.22, 4: 0.18},  # +0.10, steady
         "portool": {0: 0.15, 1: 0.05, 2: 0.12, 3: 0.07, 4: 0.10},  # ±, no separation
         "gigpo": {0: 0.11, 1: 0.11}}  # two seeds only


def fidelity(aucs):
  return {"own": {k: "independent" for k in aucs},
          "estimators": {"independent": {k: {"measures": {"auc": v}} for k, v in aucs.items()}}}


def test_claims_hold_only_when_large_enough_and_significant():
  pred = {"claims": [{"cell": "hidifftir", "vs": "grpo", "at_least": 0.05},
                     {"cell": "hidifftir", "vs": "grpo", "at_least": 0.15},
                     {"cell": "portool", "vs": "grpo", "at_least": 0.0},
                     {"cell": "gigpo", "vs": "grpo", "at_least": 0.0}],
          "order": ["hidifftir", "portool", "grpo"]}
  out = verdict(GAINS, pred, fidelity({"grpo": 0.6, "hidifftir": 0.8, "portool": 0.7,
                                       "gigpo": 0.65}))
  held = [c["held"] for c in out["claims"]]
  assert held == [True, False, False, False]
  c = out["claims"][0]
  want = scipy.stats.ttest_rel(list(GAINS["hidifftir"].values()), list(GAINS["grpo"].values()))
  assert c["difference"] == pytest.approx(0.10) and c["p_value"] == pytest.approx(want.pvalue)
  assert out["claims"][3]["seeds"] == [0, 1]
  cells = ["gigpo", "grpo", "hidifftir", "portool"]
  means = [np.mean(list(GAINS[c].values())) for c in cells]
  fid = [0.65, 0.6, 0.8, 0.7]
  rho = scipy.stats.spearmanr(fid, means).statistic
  # The exact permutation p-value, by enumerating the 24 pairings here.
  perms = [scipy.stats.spearmanr(fid, [means[i] for i in order]).statistic
           for order in itertools.permutations(range(4))]
  exact = np.mean([abs(r) >= abs(rho) - 1e-12 for r in perms])
  assert out["spearman_fidelity_gain"]["rho"] == pytest.approx(rho)
  assert out["spearman_fidelity_gain"]["p_value"] == pytest.approx(exact)
  assert out["cells"]["grpo"]["gain"] == pytest.approx(0.10)
  text = markdown(dict(out, prediction_path="p.json", fidelity_path="f.json"))
  assert "| hidifftir − grpo | +0.050 | – | +0.100" in text


def test_a_perfect_rank_correlation_of_three_cells_is_not_significant():
  """scipy's t approximation gives p = 0 for ρ = ±1 on 3 cells (the credit12 verdict first
  printed that); the exact p is 2/6: two of the six pairings have |ρ| = 1."""
  out = spearman([0.70, 0.81, 0.66], [0.147, 0.145, 0.149])
  assert out["rho"] == pytest.approx(-1.0) and out["p_value"] == pytest.approx(1 / 3)


def _run(root, name, label, seed, rl_lines, state="finished"):
  d = root / name
  d.mkdir()
  rundir.write_cell(str(d), {"label": label, "estimator": label, "options": {}, "seed": seed})
  rundir.write_status(str(d), state, 2)
  evals = [{"phase": "eval", "step": 0, "eval/accuracy": 0.3},
           {"phase": "eval", "step": 2, "eval/accuracy": 0.4}]
  with open(d / rundir.METRICS, "w") as f:
    f.writelines(json.dumps(x) + "\n" for x in [*rl_lines, *evals])


def test_training_credit_is_the_mean_over_steps_then_over_seeds(tmp_path):
  """Each measure of a finished run averaged over its RL steps (missing and NaN values
  skipped), then over the cell's seeds; unfinished runs left out."""
  rl = lambda step, **m: {"phase": "rl", "step": step, **{
      f"credit/{k}" if k != "mixed_groups" else "groups/mixed_share": v for k, v in m.items()}}
  _run(tmp_path, "a0", "grpo", 0, [rl(1, auc_query=0.6, no_signal_all_fail=0.9),
                                   rl(2, auc_query=0.8, no_signal_all_fail=float("nan"))])
  _run(tmp_path, "a1", "grpo", 1, [rl(1, auc_query=0.5, mixed_groups=0.25),
                                   rl(2, auc_query=0.5, mixed_groups=0.75), rl(3, auc_query=0.5)])
  _run(tmp_path, "b0", "portool", 0, [rl(1, auc_query=0.1)], state="running")
  out = training_credit([str(tmp_path)])
  assert set(out) == {"grpo"}
  g = out["grpo"]
  assert g["auc_query"] == pytest.approx((0.7 + 0.5) / 2)  # pooled over lines: 0.58
  assert g["no_signal_all_fail"] == pytest.approx(0.9)  # seed 1 logged none
  assert g["mixed_groups"] == pytest.approx(0.5) and g["free_credit"] is None
  text = markdown(dict(verdict({"grpo": {0: 0.1, 1: 0.1}}, {"claims": []}, fidelity({})),
                       prediction_path="p", fidelity_path="f", training_credit=out))
  assert "| grpo | 0.600 |" in text
