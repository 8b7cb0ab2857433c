"""verl's GAE and value loss on random multi-turn batches, for tirjax's `ppo` and value loss to
be checked against (issue 53; the comparison is tests/test_verl_critic.py).

    python -m experiments.studies.verl_critic --json=benchmarks/results/verl_critic.json

Needs torch (CPU is enough) and no verl install: the functions
`compute_gae_advantage_return`, `agg_loss` and `compute_value_loss` of
`verl/trainer/ppo/core_algos.py`, and `clip_by_value`, `masked_sum`, `masked_mean`,
`masked_var`, `masked_whiten` of `verl/utils/torch_functional.py`, are read from a verl git
snapshot at a fixed commit and exec'd alone (decorators dropped; `verl_F` is the namespace of
those five), so nothing else of verl is imported. Each batch: rows of alternating loss runs
(the policy's tokens) and tool-response runs (response_mask 0), some rows empty, trailing
padding; values ~ N(0, 1); the outcome in {−1, 0, +1} on the row's last response token; γ and
λ drawn from {0, 0.5, 0.9, 1}. The value loss takes vpreds = values + N(0, 0.5²), returns =
verl's, each of verl's four aggregation modes and cliprange_value in {0.2, 0.5}. Inputs and
outputs are written as float32 values, with the verl commit and the CPU.
"""

from __future__ import annotations

import time
import types
from typing import Optional

from absl import flags
import numpy as np

from tirjax import cli
from tirjax.reporting import benchmark
from tirjax.testing import peer_code

FLAGS = flags.FLAGS

VERL_COMMIT = "b178a3cd56f58b2d502255daba591e92833930a7"
CORE = "verl/trainer/ppo/core_algos.py"
TORCH_F = "verl/utils/torch_functional.py"
VERL_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def load_verl(repo: str, commit: str) -> types.SimpleNamespace:
  """verl's functions from `git show commit:path` of the snapshot at `repo`."""
  import torch  # pylint: disable=import-outside-toplevel  (only this study needs it)

  def show(path):
    return peer_code.source(repo, commit, path)
  f_ns = peer_code.load(show(TORCH_F), ("clip_by_value", "masked_sum", "masked_mean",
                                        "masked_var", "masked_whiten"),
                        {"torch": torch, "Optional": Optional}, origin=TORCH_F)
  ns = {"torch": torch, "Optional": Optional, "verl_F": types.SimpleNamespace(**f_ns)}
  peer_code.load(show(CORE), ("compute_gae_advantage_return", "agg_loss", "compute_value_loss"),
                 ns, origin=CORE)
  return types.SimpleNamespace(**{k: ns[k] for k in ("compute_gae_advantage_return",
                                                       "agg_loss", "compute_value_loss")})


def random_mask(rng: np.random.Generator, B: int, L: int) -> np.ndarray:
  """Rows of alternating loss runs (1-4 tokens) and tool responses (1-3), trailing padding;
  a row is empty with probability 0.15. At least two loss tokens in all (verl's whitening
  refuses fewer)."""
  while True:
    mask = np.zeros((B, L), np.int64)
    for b in range(B):
      if rng.random() < 0.15:
        continue
      end = int(rng.integers(1, L + 1))
      pos = 0
      while pos < end:
        n = int(rng.integers(1, 5))
        mask[b, pos:min(pos + n, end)] = 1
        pos += n + int(rng.integers(1, 4))
    if mask.sum() >= 2:
      return mask


def batch(rng: np.random.Generator, verl) -> dict:
  import torch  # pylint: disable=import-outside-toplevel
  B, L = int(rng.integers(1, 7)), int(rng.integers(2, 15))
  mask = random_mask(rng, B, L)
  values = rng.normal(size=(B, L)).astype(np.float32)
  outcome = rng.choice([-1.0, 0.0, 1.0], size=B).astype(np.float32)
  rewards = np.zeros((B, L), np.float32)
  for b in range(B):
    live = np.flatnonzero(mask[b])
    if len(live):
      rewards[b, live[-1]] = outcome[b]
  gamma, lam = (float(rng.choice([0.0, 0.5, 0.9, 1.0])) for _ in range(2))
  adv, ret = verl.compute_gae_advantage_return(
      torch.tensor(rewards), torch.tensor(values), torch.tensor(mask), gamma, lam)
  vpreds = (values + rng.normal(scale=0.5, size=(B, L))).astype(np.float32)
  clip = float(rng.choice([0.2, 0.5]))
  losses = {}
  for mode in VERL_MODES:
    loss, clipfrac = verl.compute_value_loss(torch.tensor(vpreds), ret, torch.tensor(values),
                                             torch.tensor(mask), clip, loss_agg_mode=mode)
    losses[mode] = {"vf_loss": float(loss), "vf_clipfrac": float(clipfrac)}
  return {"gamma": gamma, "lam": lam, "response_mask": mask.tolist(),
          "values": values.tolist(), "outcome": outcome.tolist(),
          "token_level_rewards": rewards.tolist(), "advantages": adv.numpy().tolist(),
          "returns": ret.numpy().tolist(), "vpreds": vpreds.tolist(),
          "cliprange_value": clip, "value_loss": losses}


def main(argv):
  del argv
  import torch  # pylint: disable=import-outside-toplevel
  torch.manual_seed(FLAGS.seed)
  info = benchmark.machine(jax_info=False)
  info["torch"] = torch.__version__
  start = time.perf_counter()
  verl = load_verl(FLAGS.verl_repo, FLAGS.commit)
  rng = np.random.default_rng(FLAGS.seed)
  batches = [batch(rng, verl) for _ in range(FLAGS.batches)]
  result = {
      "command": f"python -m experiments.studies.verl_critic --batches={FLAGS.batches} "
                 f"--seed={FLAGS.seed}",
      "verl_commit": FLAGS.commit, "verl_files": [CORE, TORCH_F],
      "verl_functions": ["compute_gae_advantage_return", "compute_value_loss", "agg_loss",
                         "masked_whiten"],
      "machine": info, "seconds": round(time.perf_counter() - start, 2), "batches": batches}
  benchmark.write_result(FLAGS.json, result, indent=None)
  print(f"{len(batches)} batches of verl's GAE and value loss -> {FLAGS.json} "
        f"({result['seconds']} s on {info['cpu']})")


def define_flags() -> None:
  """The command's flags, defined only when it runs (as the other studies)."""
  flags.DEFINE_string("json", "benchmarks/results/verl_critic.json", "Results file.")
  flags.DEFINE_string("verl_repo", "/work/.mirror/volcengine+verl/repo",
                      "A git snapshot of github.com/volcengine/verl holding --commit.")
  flags.DEFINE_string("commit", VERL_COMMIT, "The verl commit whose functions run.")
  flags.DEFINE_integer("batches", 120, "Random batches.")
  flags.DEFINE_integer("seed", 0, "Seed of the batches.")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
