"""Report of trainer run directories, or of a credit-bench result.

    python -m experiments.report runs/ablate --out=report/
    python -m experiments.report runs/a runs/b --out=report/ --baseline=grpo --last_rl=5
    python -m experiments.report benchmarks/results/credit_bench.json --out=report/credit

Writes report.md (final metrics as mean ± 95% CI over seeds, paired comparison against the
baseline by seed, runs that failed or did not finish), summary.csv, paired.csv and one
learning-curve PNG per curve (mean over seeds with a 95% CI band). Prints report.md.
"""

from __future__ import annotations

import argparse

from tirjax import reporting


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("paths", nargs="+", help="run directories (or folders of them), or one "
                      "credit-bench JSON file")
  parser.add_argument("--out", required=True, help="output folder")
  parser.add_argument("--baseline", default="grpo", help="cell label compared against")
  parser.add_argument("--last_rl", type=int, default=5,
                      help="final reward = mean over this many last RL lines")
  parser.add_argument("--title", default="tirjax report")
  args = parser.parse_args(argv)
  if args.last_rl < 1:
    parser.error(f"--last_rl: must be >= 1, got {args.last_rl}")
  study = reporting.load(args.paths, last_rl=args.last_rl, baseline=args.baseline)
  paths = reporting.write_report(study, args.out, args.title)
  with open(paths["report.md"]) as f:
    print(f.read())


if __name__ == "__main__":
  main()
