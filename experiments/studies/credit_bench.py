"""Credit-assignment bench: every estimator trained on the chain task, over seeds.

    python -m experiments.studies.credit_bench --json=benchmarks/results/credit_bench.json --seeds=0-9
    python -m experiments.studies.credit_bench --estimators=grpo,portool/omega1=0,rloo --seeds=0,1
    python -m experiments.studies.credit_bench --json=new.json --seeds=0-9 --reuse=old.json,more.json
    python -m experiments.report benchmarks/results/credit_bench.json --out=report/credit

Runs each cell (`tirjax.credit.cells`: an estimator label such as "portool/omega1=0"; by
default every registered estimator plus PORTool's ablations) for each seed on the task of
`tirjax.credit.task` (defaults), and reports per cell: episodes (training rows) until the
sampled policy's exact success reaches 90% of the optimum, final success and return, and the
unlearning rates (spec §4.1) averaged over training batches. Writes the JSON (command,
machine, options, every run with its curve) and a Markdown table next to it (`--markdown`),
and prints the table. A run that raises is recorded as failed and shown as such.

`--reuse=<earlier results>` keeps those files' finished runs whose cell (estimator, options,
rollouts, loss), seed, task and training options are the same as this command's, instead of
running them again; the first file that has a run wins. A run is deterministic given these and
the code, so this joins the pieces of one table run by the same code (seeds 0-4 and 5-9, say); a
file from older code is no substitute (the unlearning rate's definition changed in 270ba0d, for
one). Kept runs carry `"reused": true` and the file they come from; the header says how many
come from which file, run by what command on which machine. A record without a loss option
added since (e.g. `surrogate`) counts as that option's default.
"""

from __future__ import annotations

from absl import app, flags

from tirjax import cli
from tirjax.credit import bench
from tirjax.credit.task import ChainTask
from tirjax.credit.train import CreditTrainOptions


_JSON = flags.DEFINE_string("json", None, "write the results here")
_MARKDOWN = flags.DEFINE_string("markdown", None, "write the table here (default: the JSON's .md)")
_SEEDS = flags.DEFINE_string("seeds", "0-4", "e.g. 0-4 or 0,2,5")
_ESTIMATORS = flags.DEFINE_string("estimators", None, "cell labels, comma-separated (default: "
                                  "every registered estimator and PORTool's ablations)")
_ITERATIONS = flags.DEFINE_integer("iterations", CreditTrainOptions.iterations,
                                   "training batches per run", lower_bound=1)
_REUSE = flags.DEFINE_list("reuse", [], "earlier result files whose finished runs of the same "
                           "cells, seeds, task and training are kept, not rerun")
_EARLY_ANSWER = flags.DEFINE_float("early_answer", ChainTask.early_answer,
                                   "R_out of an answer before the chain is done (0: "
                                   "unable_to_answer, a local optimum above a crash's -1; -1 "
                                   "removes it)")


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  try:
    bench.checked(_SEEDS.value, _ESTIMATORS.value, _ITERATIONS.value, _EARLY_ANSWER.value)
  except (ValueError, KeyError) as e:
    raise app.UsageError(str(e)) from e
  _, table = bench.run(_SEEDS.value, _ESTIMATORS.value, _ITERATIONS.value, _EARLY_ANSWER.value,
                       _REUSE.value, _JSON.value, _MARKDOWN.value,
                       command="python -m experiments.studies.credit_bench "
                       + " ".join(_given_flags()))
  print(table)


def _given_flags() -> list[str]:
  """This command's flags that were given, as `--name=value`."""
  holders = (_JSON, _MARKDOWN, _SEEDS, _ESTIMATORS, _ITERATIONS, _EARLY_ANSWER, _REUSE)
  return [f"--{h.name}={','.join(h.value) if isinstance(h.value, list) else h.value}"
          for h in holders if h.present]


if __name__ == "__main__":
  cli.run(main)
