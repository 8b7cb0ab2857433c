"""Credit fidelity on real rollouts (spec §4.5): where each estimator puts credit.

    python -m experiments.studies.credit_fidelity --policy=runs/default --out=runs/credit_fidelity

From a policy (an HF checkpoint directory, or a run directory's `hf_export/`, e.g. the default's
warm start), samples the first `--queries` train queries of `--config`'s environment (toolworld)
at the rollout temperature, in batches of the config's `train.queries_per_step` queries as an
RL step does (each query also with one greedy episode, ReMax's baseline): once as independent
groups (`rollout.n` rows each) and once as PORTool trees of the same queries (n leaves, branching `rollout.tree`). Every turn is
labelled from the ground-truth plan (`failures.turn_labels`), every registered estimator's
advantages (its spec-default options) are computed on each batch, and the measures of
`tirjax.metrics.credit` are reported per estimator and rollout kind, with bootstrap 95% CIs
over queries. An estimator's headline row is on its own rollouts: trees for those registered
to train on trees (`register(..., rollout=dict(mode="tree"))`: PORTool, Tree-GRPO),
independent groups for the others (`rollout_fidelity.own_kind`).

Writes `<out>.json`, `<out>.md` and `<out>.png` (AUC and collateral blame with their CIs);
an existing result is never overwritten. Results: benchmarks/results/credit_fidelity.md.
"""

from __future__ import annotations

import sys

from tirjax import cli
from tirjax.credit.rollout_fidelity import DEFAULT_CONFIG, checked_experiment, markdown, measure
from tirjax.trainer import resolve


def define_flags() -> None:
  """The command's flags, defined when it runs (the module is also a library)."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  from ml_collections import config_flags  # pylint: disable=import-outside-toplevel
  config_flags.DEFINE_config_file("config", DEFAULT_CONFIG, "the experiment config whose "
                                  "environment, rollout protocol and judge the rollouts follow",
                                  lock_config=True)
  flags.DEFINE_string("policy", None, "an HF checkpoint directory or a run directory")
  flags.DEFINE_string("out", None, "output path prefix (.json, .md and .png are added)")
  flags.DEFINE_integer("queries", 256, "train queries to sample", lower_bound=1)
  flags.DEFINE_integer("bootstrap", 1000, "bootstrap resamples", lower_bound=1)


def check(argv) -> resolve.Experiment:
  """What `main` checks before any compute, for the parsed flags."""
  from absl import app, flags  # pylint: disable=import-outside-toplevel
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  for name in ("policy", "out"):
    if not f[name].value:
      raise app.UsageError(f"--{name} is required")
  return checked_experiment(f.config, f.policy, f.queries, f.out)[0]


def main(argv) -> None:
  from absl import flags  # pylint: disable=import-outside-toplevel
  check(argv)
  f = flags.FLAGS
  result = measure(f.config, f.policy, f.queries, f.out, f.bootstrap,
                   command="python -m experiments.studies.credit_fidelity " + " ".join(sys.argv[1:]))
  print(markdown(result))


if __name__ == "__main__":
  define_flags()
  cli.run(main)
