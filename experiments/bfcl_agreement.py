"""BFCL multi-turn: tirjax's episodes and scoring against bfcl-eval's own pipeline (SPEC §6.1).

    python -m experiments.bfcl_agreement --json=benchmarks/results/bfcl_agreement.json

For every entry of the four multi-turn categories: the ground truth replayed (on bfcl-eval's
side, its own call strings), and five perturbations of it (drop the last call, perturb an
argument, no calls, duplicate a call, reorder a turn; see `tirjax.testing.reference.bfcl`).
Each call sequence is scored twice: by tirjax (step texts through the parser, `ToolEnv`'s
dialogue turns, the sandboxed back-end and checker) and by bfcl-eval's pipeline composed from
its own functions in this process. Writes the agreement, per category and per variant, with
every disagreement and the two decoded call lists behind it.
"""

from __future__ import annotations

import collections
import time

import numpy as np
from absl import flags

from tirjax import cli
from tirjax.env.datasets.bfcl import MULTI_TURN_CATEGORIES, load_bfcl
from tirjax.env.sandbox import Sandbox
from tirjax.reporting import benchmark
from tirjax.testing.reference import bfcl as ref

FLAGS = flags.FLAGS


def entry_of(task) -> dict:
  return {"id": task.task_id, "initial_config": task.metadata["initial_config"],
          "involved_classes": task.metadata["involved_classes"]}


def agreement(tasks, seed: int = 0) -> dict:
  """Scores every task's variants both ways; returns counts and the disagreements."""
  counts = collections.defaultdict(lambda: collections.Counter())
  disagreements = []
  gt_valid = collections.Counter()
  gt_invalid = []
  for n, task in enumerate(tasks):
    rng = np.random.default_rng([seed, n])
    category = task.metadata["category"]
    ground_truth = task.metadata["ground_truth"]
    gt_turns = task.metadata["gt_turns"]
    variants = {"ground_truth": gt_turns, **ref.perturbations(gt_turns, rng)}
    for name, turns in variants.items():
      steps = ref.with_turn_ends(turns)
      ours, our_calls = ref.project_verdict(task, steps)
      theirs, their_calls = ref.reference_verdict(
          entry_of(task), ground_truth, category, steps,
          raw_calls=ground_truth if name == "ground_truth" else None)
      if name == "ground_truth":
        gt_valid[category] += bool(theirs)
        if not theirs:
          longest = max(len(t) for t in ground_truth)
          gt_invalid.append({"id": task.task_id, "tirjax": ours, "longest_turn_calls": longest})
      kind = name if name in ("ground_truth", "no_calls") else "perturbed"
      counts[category][f"{kind}/n"] += 1
      counts[category][f"{kind}/agree"] += ours == theirs
      counts[category][f"{kind}/valid"] += bool(theirs)
      counts[category]["n"] += 1
      counts[category]["agree"] += ours == theirs
      counts["variant:" + name]["n"] += 1
      counts["variant:" + name]["agree"] += ours == theirs
      if ours != theirs:
        disagreements.append({"id": task.task_id, "variant": name, "tirjax": ours,
                              "bfcl_eval": theirs, "tirjax_decoded": our_calls,
                              "bfcl_eval_decoded": their_calls})
  total = sum(c["n"] for k, c in counts.items() if not k.startswith("variant:"))
  agree = sum(c["agree"] for k, c in counts.items() if not k.startswith("variant:"))
  return {"entries": len(tasks), "sequences": total, "agree": agree,
          "agreement": agree / max(total, 1),
          "ground_truth_valid_by_bfcl_eval": dict(gt_valid),
          # Replayed one call per step, a turn of more than 20 calls is force-quit by
          # bfcl-eval's step limit (MAXIMUM_STEP_LIMIT): both sides fail these entries.
          "ground_truth_invalid_by_bfcl_eval": gt_invalid,
          "by_category": {k: dict(v) for k, v in counts.items() if not k.startswith("variant:")},
          "by_variant": {k.split(":", 1)[1]: dict(v) for k, v in counts.items()
                         if k.startswith("variant:")},
          "disagreements": disagreements}


def main(argv):
  del argv
  info = benchmark.machine(jax_info=False)
  start = time.perf_counter()
  with Sandbox() as sandbox:
    tasks = load_bfcl(sandbox, categories=MULTI_TURN_CATEGORIES, limit=FLAGS.limit)
    result = agreement(tasks, FLAGS.seed)
  command = "python -m experiments.bfcl_agreement" + (
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
