"""tirjax's BFCL multi-turn verdict against bfcl-eval's own checker, call sequence by call
sequence: each entry's ground truth and perturbations of it (`reference.bfcl.perturbations`)
scored both ways. `experiments.studies.bfcl_agreement` runs it over the whole benchmark and
writes benchmarks/results/bfcl_agreement.json; the tests run it on a few entries.
"""

from __future__ import annotations

import collections

import numpy as np

from tirjax.testing.reference import bfcl as ref


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
