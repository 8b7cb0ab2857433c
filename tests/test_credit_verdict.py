"""The credit testbed's verdict: claims checked by the paired t-test over seeds, and the rank
correlation of fidelity with gains (against scipy)."""

import numpy as np
import pytest
import scipy.stats

from experiments.credit_verdict import markdown, verdict

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
  rho = scipy.stats.spearmanr([0.65, 0.6, 0.8, 0.7], means)
  assert out["spearman_fidelity_gain"]["rho"] == pytest.approx(rho.statistic)
  assert out["spearman_fidelity_gain"]["p_value"] == pytest.approx(rho.pvalue)
  assert out["cells"]["grpo"]["gain"] == pytest.approx(0.10)
  text = markdown(dict(out, prediction_path="p.json", fidelity_path="f.json"))
  assert "| hidifftir − grpo | +0.050 | – | +0.100" in text
