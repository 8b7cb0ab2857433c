"""verl's own estimator functions on random batches: inputs and outputs, for the cross-check.

    python -m experiments.studies.verl_crosscheck --verl=../verl-project+verl/repo \\
        --json=benchmarks/results/verl_crosscheck_otb_gdpo.json

verl is no dependency of tirjax, so its code is never imported by the package or the tests.
This study reads verl's source from a checkout or a bare git directory (`--verl`, at
`--commit`, default its HEAD), takes from `verl/trainer/ppo/core_algos.py` only the functions
it checks (`compute_optimal_token_baseline_advantage`,
`compute_multi_turn_optimal_token_baseline_advantage`, `compute_gdpo_outcome_advantage` and
the `compute_grpo_outcome_advantage` that GDPO calls) and from `verl/utils/torch_functional.py`
`masked_sum`, `masked_mean`, `masked_var` and `masked_whiten`, by their syntax trees (their
decorators dropped, the rest of verl and its imports never run), and runs them with torch on
random batches in verl's layout: groups of 1-5 rows (singletons, all-equal outcomes), response
masks of one turn (contiguous) or several (generated runs with tool responses between them,
and rows without generated tokens), old log-probs and Σπ² of a softmax over a small
vocabulary, the outcome R_out on the last generated token, a format reward per row (GDPO's
second reward), and one batch made for GDPO's degenerate case (two rewards whose z-scores
cancel). It writes each batch's inputs and verl's advantages on the generated tokens
to `--json` (nothing of verl's code). tests/test_otb_gdpo_crosscheck.py rebuilds each batch as
`Rollouts`, runs tirjax's kernels with verl's conventions and compares; the differences it
finds, and why, are in that file's docstring.

Needs torch (requirements-test.txt); about 10 s on 2 cores.
"""

from __future__ import annotations

import os
import time
import types
from collections import defaultdict
from typing import Any, Optional

import numpy as np
from absl import app, flags

from tirjax.reporting import benchmark
from tirjax.testing import peer_code

CORE = "verl/trainer/ppo/core_algos.py"
TORCH_F = "verl/utils/torch_functional.py"
FUNCTIONS = {
    CORE: ("compute_grpo_outcome_advantage", "compute_gdpo_outcome_advantage",
           "compute_optimal_token_baseline_advantage",
           "compute_multi_turn_optimal_token_baseline_advantage"),
    TORCH_F: ("masked_sum", "masked_mean", "masked_var", "masked_whiten"),
}
GDPO_KEYS = ("outcome", "format")
VOCAB = 8


def define_flags():
  flags.DEFINE_string("verl", None, "a checkout of verl, or its bare git directory", required=True)
  flags.DEFINE_string("commit", "HEAD", "the commit to read (a bare git directory's, or the "
                      "checkout's when it is one)")
  flags.DEFINE_string("json", "benchmarks/results/verl_crosscheck_otb_gdpo.json", "output")
  flags.DEFINE_integer("cases", 24, "random batches, half one turn and half several")
  flags.DEFINE_integer("seed", 0, "seed of the first batch (batch k uses seed + k)")


def read_source(verl: str, commit: str, path: str) -> str:
  """The file `path` of verl at `commit` (the checkout's own file for HEAD)."""
  plain = os.path.join(verl, path)
  if commit == "HEAD" and os.path.exists(plain):
    with open(plain) as f:
      return f.read()
  return peer_code.source(verl, commit, path)


def load_functions(sources: dict[str, str]) -> dict[str, Any]:
  """verl's named functions, compiled from their syntax trees in one namespace with what they
  use (torch, numpy, defaultdict; `verl_F` the torch_functional ones), decorators dropped."""
  import torch  # pylint: disable=import-outside-toplevel
  ns: dict[str, Any] = {"torch": torch, "np": np, "defaultdict": defaultdict,
                        "Optional": Optional, "Any": Any, "AlgoConfig": dict}
  for path, names in FUNCTIONS.items():
    peer_code.load(sources[path], names, ns, origin=f"verl:{path}")
  ns["verl_F"] = types.SimpleNamespace(**{n: ns[n] for n in FUNCTIONS[TORCH_F]})
  return ns


def _mask_row(rng: np.random.Generator, length: int, multi: bool) -> np.ndarray:
  """One response mask: a contiguous run, or runs of 1-4 generated tokens with 1-3
  tool-response tokens between them; some multi-turn rows generate nothing."""
  mask = np.zeros(length, np.int64)
  if not multi:
    mask[:int(rng.integers(1, length + 1))] = 1
    return mask
  if rng.random() < 0.1:
    return mask
  pos = 0
  for turn in range(int(rng.integers(1, 4))):
    if turn:
      pos += int(rng.integers(1, 4))
    n = int(rng.integers(1, 5))
    if pos + n > length:
      break
    mask[pos:pos + n] = 1
    pos += n
  return mask


def random_case(seed: int, multi: bool, length: int = 20, prompt: int = 3) -> dict:
  """A batch in verl's layout (numpy), float32 where verl's tensors are."""
  rng = np.random.default_rng(seed)
  sizes = rng.integers(1, 6, int(rng.integers(1, 5)))
  index = np.repeat(np.arange(len(sizes)), sizes)
  B = len(index)
  outcome = rng.choice([-1.0, 0.0, 1.0], B)
  for g in range(len(sizes)):
    if rng.random() < 0.25:  # an all-equal group
      outcome[index == g] = outcome[index == g][0]
  mask = np.stack([_mask_row(rng, length, multi) for _ in range(B)])
  fmt = np.where(mask.any(1), rng.choice([-0.25, 0.0, 0.25], B), 0.0)
  logits = rng.standard_normal((B, length, VOCAB)) * rng.uniform(0.5, 4.0)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  token = (rng.random((B, length, 1)) > np.cumsum(probs, -1)).sum(-1).clip(0, VOCAB - 1)
  logp = np.log(np.take_along_axis(probs, token[..., None], -1)[..., 0])
  s2 = (probs ** 2).sum(-1)
  return dict(seed=seed, layout="multi" if multi else "single", prompt_length=prompt,
              index=index, response_mask=mask, outcome=outcome, format=fmt,
              old_log_probs=np.where(mask == 1, logp, 0.0).astype(np.float32),
              sum_pi_squared=np.where(mask == 1, s2, 0.0).astype(np.float32))


def cancelling_case() -> dict:
  """GDPO's degenerate batch: one group of two rows whose rewards' z-scores cancel, (R_out,
  format) = (+1, −0.25) and (−1, +0.25); the decoupled sums are eps terms alone."""
  rng = np.random.default_rng(12345)
  mask = np.zeros((2, 20), np.int64)
  mask[:, :3] = 1
  logp = np.where(mask == 1, -rng.exponential(1.0, mask.shape), 0.0)
  return dict(seed="cancelling", layout="single", prompt_length=3, index=np.array([0, 0]),
              response_mask=mask, outcome=np.array([1.0, -1.0]), format=np.array([-0.25, 0.25]),
              old_log_probs=logp.astype(np.float32),
              sum_pi_squared=np.where(mask == 1, np.exp(2 * logp), 0.0).astype(np.float32))


def run_verl(ns: dict, case: dict) -> dict[str, np.ndarray]:
  """verl's advantages [B, L] for each checked call on the batch `case`."""
  import torch  # pylint: disable=import-outside-toplevel
  mask = torch.tensor(case["response_mask"], dtype=torch.float32)
  B, L = mask.shape
  last = torch.tensor([int(np.flatnonzero(m)[-1]) if m.any() else 0
                       for m in case["response_mask"]])
  rewards = torch.zeros(B, L)
  rewards[torch.arange(B), last] = torch.tensor(case["outcome"], dtype=torch.float32)
  index = np.array([str(i) for i in case["index"]], dtype=object)
  common = dict(token_level_rewards=rewards, response_mask=mask, index=index,
                old_log_probs=torch.tensor(case["old_log_probs"]),
                sum_pi_squared=torch.tensor(case["sum_pi_squared"]))
  out = {}
  for zero_tail in (False, True):
    suffix = "_zero_tail" if zero_tail else ""
    out["otb" + suffix] = ns["compute_optimal_token_baseline_advantage"](
        **common, handle_zero_tail=zero_tail)[0]
    out["tir" + suffix] = ns["compute_multi_turn_optimal_token_baseline_advantage"](
        **common, handle_zero_tail=zero_tail)[0]
  # GDPO: the rewards as verl's reward manager hands them over, one entry per key; the
  # attention mask marks the prompt and every real response token (tool responses included).
  P = case["prompt_length"]
  real = np.zeros((B, L), np.int64)
  for b, m in enumerate(case["response_mask"]):
    if m.any():
      real[b, :np.flatnonzero(m)[-1] + 1] = 1
  batch = {"prompts": torch.zeros(B, P, dtype=torch.long),
           "attention_mask": torch.tensor(np.concatenate([np.ones((B, P), np.int64), real], 1))}
  non_tensor = {"outcome": case["outcome"].astype(np.float32),
                "format": case["format"].astype(np.float32)}
  for name, weights in (("gdpo", None), ("gdpo_weighted", [1.0, 0.5])):
    if mask.sum() < 2:  # masked_whiten raises on fewer than two tokens; tirjax gives 0
      continue
    config = {"gdpo_reward_keys": list(GDPO_KEYS), "norm_adv_by_std_in_grpo": True}
    if weights is not None:
      config["gdpo_reward_weights"] = weights
    out[name] = ns["compute_gdpo_outcome_advantage"](
        token_level_rewards=rewards, response_mask=mask, index=index, config=config,
        non_tensor_batch=non_tensor, batch=batch)[0]
  return {k: v.detach().numpy() for k, v in out.items()}


def _live(values: np.ndarray, mask: np.ndarray, digits: int) -> list[list[float]]:
  """Each row's values on its generated tokens, in order, rounded to `digits` significant."""
  return [[float(f"{x:.{digits}g}") for x in row[m == 1]] for row, m in zip(values, mask)]


def record(case: dict, outputs: dict[str, np.ndarray]) -> dict:
  mask = case["response_mask"]
  return {"seed": case["seed"], "layout": case["layout"],
          "prompt_length": case["prompt_length"], "index": case["index"].tolist(),
          "response_mask": ["".join(map(str, m)) for m in mask],
          "outcome": case["outcome"].tolist(), "format": case["format"].tolist(),
          "old_log_probs": _live(case["old_log_probs"], mask, 9),
          "sum_pi_squared": _live(case["sum_pi_squared"], mask, 9),
          "verl": {k: _live(v, mask, 8) for k, v in outputs.items()}}


def main(argv):
  del argv
  import torch  # pylint: disable=import-outside-toplevel
  fv = flags.FLAGS
  start = time.perf_counter()
  commit = peer_code.resolve(fv.verl, fv.commit)
  sources = {path: read_source(fv.verl, commit, path) for path in FUNCTIONS}
  ns = load_functions(sources)
  cases = []
  for k in range(fv.cases):
    case = random_case(fv.seed + k, multi=k % 2 == 1)
    cases.append(record(case, run_verl(ns, case)))
  cases.append(record(cancelling_case(), run_verl(ns, cancelling_case())))
  # The peer's location is this machine's, so the command names the repository instead.
  result = {"command": "python -m experiments.studies.verl_crosscheck "
                       f"--verl=<a git clone of volcengine/verl> --json={fv.json} "
                       f"--cases={fv.cases} --seed={fv.seed}",
            "machine": benchmark.machine(),
            "verl": {"commit": commit, "functions": {p: list(n) for p, n in FUNCTIONS.items()}},
            "torch": torch.__version__, "gdpo_reward_keys": list(GDPO_KEYS),
            "gdpo_reward_weights": {"gdpo": None, "gdpo_weighted": [1.0, 0.5]},
            "cases": cases, "seconds": round(time.perf_counter() - start, 1)}
  benchmark.write_result(fv.json, result, indent=None)
  print(f"{len(cases)} batches, verl {commit[:12]}: {fv.json}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
