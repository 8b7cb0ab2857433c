"""The credit testbed's verdict: the ablation against the prediction written before it, and
whether credit fidelity predicts learning (issue 37).

    python -m experiments.credit_verdict runs/credit \\
        --prediction=benchmarks/results/ablation_credit/prediction.json --out=runs/credit_verdict

Reads the grid's run directories (`experiments.ablate --config=configs/ablate.py:grid=credit`),
the prediction (a JSON file committed before the grid ran: the fidelity result it was read
from, each claim as a cell, its comparator and the least greedy-accuracy gain over it, and the
predicted order of the cells) and that fidelity result. Writes `<out>.json` and `<out>.md`:
each cell's greedy-accuracy gain over its warm start (mean and 95% CI over seeds), the paired
difference from each claim's comparator with its p-value (two-sided paired t-test), whether
each claim held (difference at least the predicted one and p < 0.05), Spearman's rank
correlation between the cells' fidelity and their mean gains, with its p-value, and what each
cell's credit was while it trained (`TRAINING_CREDIT`: the `credit/*` and `groups/*` metrics of
its RL steps, the mean over steps, then over seeds): the measured side of a claim that did not
hold.
"""

from __future__ import annotations

import json
import os
import sys

from tirjax import cli
from tirjax.ablation.verdict import gains_by_cell, markdown, training_credit, verdict
from tirjax.reporting import benchmark


def define_flags() -> None:
  """The command's flags, defined when it runs (the module is also a library)."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  flags.DEFINE_string("prediction", None, "the prediction JSON")
  flags.DEFINE_string("out", None, "output path prefix (.json and .md are added)")


def check(argv) -> tuple[dict, dict]:
  """What `main` reads before writing: the prediction and its fidelity result (returned), the
  run directories given, an output that does not exist yet."""
  from absl import app, flags  # pylint: disable=import-outside-toplevel
  f = flags.FLAGS
  if len(argv) < 2:
    raise app.UsageError("give the grid's workdir (or its run directories)")
  for name in ("prediction", "out"):
    if not f[name].value:
      raise app.UsageError(f"--{name} is required")
  for path in argv[1:]:
    if not os.path.isdir(path):
      raise app.UsageError(f"{path}: not a directory (a grid's workdir or a run directory)")
  for ext in (".json", ".md"):
    if os.path.exists(f.out + ext):
      raise FileExistsError(f"--out: {f.out + ext} exists (never overwritten)")
  try:
    with open(f.prediction) as fh:
      pred = json.load(fh)
    with open(pred["fidelity"]) as fh:
      fid = json.load(fh)
  except (OSError, ValueError, KeyError) as e:
    raise app.UsageError(f"--prediction={f.prediction}: cannot read it or the fidelity result "
                         f"it names ({type(e).__name__}: {e})") from None
  return pred, fid


def main(argv) -> None:
  from absl import flags  # pylint: disable=import-outside-toplevel
  f = flags.FLAGS
  pred, fid = check(argv)
  result = verdict(gains_by_cell(argv[1:]), pred, fid)
  result["training_credit"] = training_credit(argv[1:])
  result.update(prediction_path=f.prediction, fidelity_path=pred["fidelity"],
                command="python -m experiments.credit_verdict " + " ".join(sys.argv[1:]),
                machine=benchmark.machine(jax_info=False))
  benchmark.write_result(f.out + ".json", result)
  benchmark.write_markdown(f.out + ".md", markdown(result))
  print(markdown(result))


if __name__ == "__main__":
  define_flags()
  cli.run(main)
