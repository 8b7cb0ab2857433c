"""MT-GRPO's own advantage code on random batches: inputs and outputs, for the cross-check.

    python -m experiments.studies.mt_grpo_crosscheck --peer=../Multi-Turn-RL-Agent \\
        --json=benchmarks/results/mt_grpo_crosscheck.json

MT-GRPO's code (SiliangZeng/Multi-Turn-RL-Agent, the paper's) is no dependency of tirjax and
never enters the repository or the tests. This study reads two methods from its source (a
checkout or a bare git directory, `--peer`, at `--commit`): `_compute_normalized_advantages`
of `GRPOEnvTrainer` (verifiers/trainers/grpo_env_trainer.py: the group z-score, eps 1e-4) and
`_assign_advantages` of `MTGRPOEnvTrainer` (verifiers/trainers/mt_grpo_env_trainer.py: the
outcome advantage on every token plus λ times the turn advantage on the tokens before the
first tool result; a row without a tool result gets the z-score of turn + outcome reward),
compiled from their syntax trees and called with a stand-in `self` (group size, λ, process 0
on the CPU); TRL, accelerate and the rest of the trainer never run. Batches: groups of 4 rows
(the code's fixed group size), each row one turn (its answer, no tool result) or two (a tool
call, its result, the answer), a turn reward on the first turn in {0, 0.125, 0.25} (0 for a
row without a tool result), R_out in {−1, 0, +1}, λ ∈ {1, 0.5}. It writes each batch's inputs
and the code's token advantages to `--json`; tests/test_mt_grpo.py rebuilds each batch as
`Rollouts` and compares `mt_grpo` with `credit="immediate"`. Needs torch
(requirements-test.txt); a few seconds.
"""

from __future__ import annotations

import time
import types

import numpy as np
from absl import app, flags

from tirjax.reporting import benchmark
from tirjax.testing import peer_code

METHODS = {"verifiers/trainers/grpo_env_trainer.py": ("GRPOEnvTrainer",
                                                      "_compute_normalized_advantages"),
           "verifiers/trainers/mt_grpo_env_trainer.py": ("MTGRPOEnvTrainer",
                                                         "_assign_advantages")}
GROUP = 4


def define_flags():
  flags.DEFINE_string("peer", None, "a checkout of SiliangZeng/Multi-Turn-RL-Agent, or its bare "
                      "git directory", required=True)
  flags.DEFINE_string("commit", "HEAD", "the commit to read")
  flags.DEFINE_string("json", "benchmarks/results/mt_grpo_crosscheck.json", "output")
  flags.DEFINE_integer("cases", 20, "random batches")
  flags.DEFINE_integer("seed", 0, "seed of the first batch (batch k uses seed + k)")


def load_methods(sources: dict[str, str]) -> dict:
  """The two methods as plain functions of (self, ...), in one namespace."""
  import torch  # pylint: disable=import-outside-toplevel
  ns = {"torch": torch}
  for path, (cls, name) in METHODS.items():
    peer_code.load(sources[path], (name,), ns, cls=cls, origin=f"peer:{path}")
  return ns


def random_case(seed: int, length: int = 16) -> dict:
  rng = np.random.default_rng(seed)
  groups = int(rng.integers(1, 5))
  B = groups * GROUP
  two_turns = rng.random(B) < 0.7
  turn = np.where(two_turns, rng.choice([0.0, 0.125, 0.25], B), 0.0)
  outcome = rng.choice([-1.0, 0.0, 1.0], B)
  for g in range(groups):  # some all-equal groups
    if rng.random() < 0.25:
      outcome[g * GROUP:(g + 1) * GROUP] = outcome[g * GROUP]
  mask = np.zeros((B, length), np.int64)
  layout = []
  for b in range(B):
    first = int(rng.integers(1, 5))
    if two_turns[b]:
      result, second = int(rng.integers(1, 4)), int(rng.integers(1, 5))
      mask[b, :first] = 1
      mask[b, first + result:first + result + second] = 1
      layout.append([first, result, second])
    else:
      mask[b, :first] = 1
      layout.append([first])
  return dict(seed=seed, coef=float(rng.choice([1.0, 0.5])), layout=layout, turn_reward=turn,
              outcome=outcome, completion_mask=mask)


def run_peer(ns: dict, case: dict) -> np.ndarray:
  """The code's [B, L] advantages (its reward functions' outputs given: turn, outcome, and
  their sum as its combined reward, weights 1)."""
  import torch  # pylint: disable=import-outside-toplevel
  B = len(case["outcome"])
  self = types.SimpleNamespace(num_generations=GROUP, turn_advantage_coef=case["coef"],
                               accelerator=types.SimpleNamespace(process_index=0, device="cpu"))
  turn = torch.tensor(case["turn_reward"], dtype=torch.float32)
  outcome = torch.tensor(case["outcome"], dtype=torch.float32)
  norm = ns["_compute_normalized_advantages"]
  turn_adv, outcome_adv, combined_adv = (norm(self, x, B)[2] for x in (turn, outcome,
                                                                         turn + outcome))
  result_segment = [1 if len(layout) == 3 else -1 for layout in case["layout"]]
  mask = torch.tensor(case["completion_mask"])
  return ns["_assign_advantages"](self, mask, turn_adv, outcome_adv, combined_adv,
                                  result_segment).numpy()


def main(argv):
  del argv
  import torch  # pylint: disable=import-outside-toplevel
  fv = flags.FLAGS
  start = time.perf_counter()
  commit = peer_code.resolve(fv.peer, fv.commit)
  ns = load_methods({p: peer_code.source(fv.peer, commit, p) for p in METHODS})
  cases = []
  for k in range(fv.cases):
    case = random_case(fv.seed + k)
    adv = run_peer(ns, case)
    mask = case["completion_mask"]
    cases.append({"seed": case["seed"], "coef": case["coef"], "layout": case["layout"],
                  "turn_reward": case["turn_reward"].tolist(),
                  "outcome": case["outcome"].tolist(),
                  "advantages": [[float(f"{x:.8g}") for x in row[m == 1]]
                                 for row, m in zip(adv, mask)]})
  # The peer's location is this machine's, so the command names the repository instead.
  result = {"command": "python -m experiments.studies.mt_grpo_crosscheck "
                       f"--peer=<a git clone of SiliangZeng/Multi-Turn-RL-Agent> --json={fv.json} "
                       f"--cases={fv.cases} --seed={fv.seed}",
            "machine": benchmark.machine(),
            "peer": {"repo": "SiliangZeng/Multi-Turn-RL-Agent", "commit": commit,
                     "methods": {p: ".".join(m) for p, m in METHODS.items()}},
            "torch": torch.__version__, "group_size": GROUP, "cases": cases,
            "seconds": round(time.perf_counter() - start, 1)}
  benchmark.write_result(fv.json, result, indent=None)
  print(f"{len(cases)} batches, MT-GRPO {commit[:12]}: {fv.json}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
