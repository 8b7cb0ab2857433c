"""BFCL multi-turn: tirjax's episodes and scoring against bfcl-eval's own pipeline (spec §6.1).

    python -m experiments.studies.bfcl_agreement --json=benchmarks/results/bfcl_agreement.json

For every entry of the four multi-turn categories: the ground truth replayed (on bfcl-eval's
side, its own call strings), and five perturbations of it (drop the last call, perturb an
argument, no calls, duplicate a call, reorder a turn; see `tirjax.testing.reference.bfcl`).
Each call sequence is scored twice: by tirjax (step texts through the parser, `ToolEnv`'s
dialogue turns, the sandboxed back-end and checker) and by bfcl-eval's pipeline composed from
its own functions in this process. Writes the agreement, per category and per variant, with
every disagreement and the two decoded call lists behind it.
"""

from __future__ import annotations

import time

from absl import flags

from tirjax import cli
from tirjax.env.datasets.bfcl import MULTI_TURN_CATEGORIES, load_bfcl
from tirjax.env.sandbox import Sandbox
from tirjax.reporting import benchmark
from tirjax.testing.bfcl_agreement import agreement

FLAGS = flags.FLAGS


def main(argv):
  del argv
  info = benchmark.machine(jax_info=False)
  start = time.perf_counter()
  with Sandbox() as sandbox:
    tasks = load_bfcl(sandbox, categories=MULTI_TURN_CATEGORIES, limit=FLAGS.limit)
    result = agreement(tasks, FLAGS.seed)
  command = "python -m experiments.studies.bfcl_agreement" + (
      f" --limit={FLAGS.limit}" if FLAGS.limit else "")
  import bfcl_eval  # pylint: disable=import-outside-toplevel
  result = {"command": command, "bfcl_eval": getattr(bfcl_eval, "__version__", "2026.3.23"),
            "machine": info, "seconds": round(time.perf_counter() - start, 1), **result}
  benchmark.write_result(FLAGS.json, result)
  print(f"{result['agree']} of {result['sequences']} call sequences agree "
        f"({result['agreement']:.2%}) over {result['entries']} entries; "
        f"{len(result['disagreements'])} disagreements; {result['seconds']} s")


def define_flags() -> None:
  """The command's flags. Defined only when it runs: the tests import this module beside other
  entry points that define flags of the same names."""
  flags.DEFINE_string("json", "benchmarks/results/bfcl_agreement.json", "Results file.")
  flags.DEFINE_integer("limit", None, "Entries per category (default: all).")
  flags.DEFINE_integer("seed", 0, "Seed of the perturbations.")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
