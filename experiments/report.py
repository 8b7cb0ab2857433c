"""Report of trainer run directories, or of a credit-bench result.

    python -m experiments.report runs/ablate --out=report/
    python -m experiments.report runs/a runs/b --out=report/ --baseline=grpo --last_rl=5
    python -m experiments.report benchmarks/results/credit_bench.json --out=report/credit

Writes report.md (final metrics as mean ± 95% CI over seeds, paired comparison against the
baseline by seed, runs that failed or did not finish), summary.csv, paired.csv and one
learning-curve PNG per curve (mean over seeds with a 95% CI band). Prints report.md.
"""

from __future__ import annotations

from absl import app, flags

from tirjax import cli, reporting

_OUT = flags.DEFINE_string("out", None, "output folder (required)")
_BASELINE = flags.DEFINE_string("baseline", "grpo", "cell label compared against")
_LAST_RL = flags.DEFINE_integer("last_rl", 5, "final reward = mean over this many last RL lines",
                                lower_bound=1)
_TITLE = flags.DEFINE_string("title", "tirjax report", "the report's title")


def check(argv) -> reporting.Study:
  """What `main` reads before writing: the runs (or credit-bench result) of the paths given."""
  paths = argv[1:]  # run directories (or folders of them), or one credit-bench JSON file
  if not paths:
    raise app.UsageError("give at least one run directory or credit-bench JSON file")
  if not _OUT.value:
    raise app.UsageError("--out: the output folder is required")
  try:
    return reporting.load(paths, last_rl=_LAST_RL.value, baseline=_BASELINE.value)
  except (OSError, ValueError) as e:
    raise app.UsageError(str(e)) from None


def main(argv) -> None:
  study = check(argv)
  paths = reporting.write_report(study, _OUT.value, _TITLE.value)
  with open(paths["report.md"]) as f:
    print(f.read())


if __name__ == "__main__":
  cli.run(main)
