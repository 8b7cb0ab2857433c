"""Train a tool-using agent: supervised warm-start, then agentic RL with a registered estimator.

    python -m experiments.train --config=configs/hidifftir.py:model=tiny --workdir=runs/default

Restarting with the same --workdir resumes from the last checkpoint. The run itself is
`tirjax.trainer.train.run`; `--print_config` prints every key with its value and source.
"""

from absl import app, flags, logging
from ml_collections import config_flags

from configs import base
from tirjax import cli
from tirjax.ablation.grid import config_module
from tirjax.trainer import prepare, resolve
from tirjax.trainer.train import run

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Experiment config, e.g. configs/portool.py:model=tiny",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Run directory (created, or resumed when it holds this run).")
flags.DEFINE_bool("print_config", False, "Print every config key with its value and where it "
                  "came from (configs/base.py `provenance`), then exit without training.")
flags.mark_flag_as_required("config")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # Orbax logs every save at INFO
  if FLAGS.print_config:
    config_file, _, arg = config_flags.get_config_filename(FLAGS["config"]).partition(":")
    print("\n".join(f"{key} = {value!r}  # {source}" for key, value, source in base.provenance(
        config_module(config_file).get_config, config_file, arg or None, FLAGS.config)))
    return
  if not FLAGS.workdir:
    raise app.UsageError("--workdir is required (the run directory)")
  run(FLAGS.config, FLAGS.workdir)


def check(argv) -> resolve.Experiment:
  """What `run` checks before any compute: the config's options, its shapes fitted to its
  data (`prepare.experiment`)."""
  del argv
  return prepare.experiment(FLAGS.config)


if __name__ == "__main__":
  cli.run(main)
