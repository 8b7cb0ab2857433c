"""Train a tool-using agent: supervised warm-start, then agentic RL with a registered estimator.

    python -m experiments.train --config=configs/hidifftir.py:model=tiny --workdir=runs/default

The same --workdir resumes from its last checkpoint. The run is `tirjax.trainer.train.run`."""

from absl import app, flags, logging
from ml_collections import config_flags

from tirjax import cli
from tirjax.trainer import prepare, resolve, sections
from tirjax.trainer.train import run

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "e.g. configs/portool.py:model=tiny", lock_config=True)
flags.DEFINE_string("workdir", None, "Run directory (created, or resumed when it holds this run).")
flags.DEFINE_bool("print_config", False, "Print every config key with its value, where it came "
                  "from and what it is (tirjax/trainer/sections.py `provenance_text`), then "
                  "exit without training.")
flags.mark_flag_as_required("config")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # Orbax logs every save at INFO
  if FLAGS.print_config:
    return print(sections.provenance_text(config_flags.get_config_filename(FLAGS["config"]),
                                          FLAGS.config))
  if not FLAGS.workdir:
    raise app.UsageError("--workdir is required (the run directory)")
  run(FLAGS.config, FLAGS.workdir)


def check(argv) -> resolve.Experiment:
  """What `run` checks before any compute (`prepare.experiment`)."""
  return prepare.experiment(FLAGS.config)


if __name__ == "__main__":
  cli.run(main)
