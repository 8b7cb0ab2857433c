"""Study of the rollout corrections (TIS, MIS; `loss.rollout_correction`, issue 54 item 2).

    python -m benchmarks.bench_rollout_correction --sections=gradients \\
        --json=benchmarks/results/rollout_correction.json
    python -m benchmarks.bench_rollout_correction --sections=vllm \\
        --json=benchmarks/results/rollout_correction.json
    python -m benchmarks.bench_rollout_correction --sections=verl \\
        --verl_helper=verl/verl/trainer/ppo/rollout_corr_helper.py \\
        --verl_torch_functional=verl/verl/utils/torch_functional.py \\
        --verl_commit=b178a3cd56f58b2d502255daba591e92833930a7 \\
        --json=benchmarks/results/rollout_correction.json

Sections (each written under its name into the JSON file, other sections of an existing file
kept; each records the machine, its CPU named as /proc/cpuinfo gives it):

* `gradients`: by how much each correction moves a mismatched sampler's policy gradient toward
  the on-policy one (`tirjax.testing.offpolicy_gradients`: a tiny model over 8 tokens whose
  8^3 continuations are all enumerated). Per perturbation of the sampler (sampled at T = 0.7
  or 1.5 against a trainer at T = 1; its weights rounded to bfloat16) and per correction (none;
  verl's presets: token TIS, sequence TIS, sequence TIS + sequence MIS, geometric MIS with
  token TIS; untruncated sequence IS): the cosine and relative error against the on-policy
  gradient of the expected gradient (exact, every continuation weighted by the sampler's
  probability) and of `--samples` draws (mean and sd over `--seeds`), with the sampler's
  share of tokens truncated and of probability mass masked.
* `vllm`: a few RL steps of GRPO on toolworld through the trainer with the vLLM sampler (its
  own server, launched from `.venv-vllm`), after a short SFT, with the corrections on; per
  step, the trainer's `rollout_corr/*` figures (the gap |log π_old − log π_sampler| by
  quantile, the weights, the shares truncated and masked). Runs: vLLM in float32 (the
  trainer's dtype) and in bfloat16 (`sampler.vllm_dtype`, the mismatch the corrections are
  for), the latter also under tighter bounds (geometric MIS at [0.999, 1.001], verl's Geo-RS,
  with token TIS at C = 1.002).
* `verl`: the kernels against verl's own `compute_rollout_correction_weights` and
  `compute_rollout_rejection_mask`, exec'd from the files of a verl checkout given by
  `--verl_helper` and `--verl_torch_functional` (verl is not a dependency; nothing of it is
  copied), on `--verl_batches` random batches: weight and row mismatches. torch is needed.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

import numpy as np
from absl import app, flags

from tirjax import cli
from tirjax.loss.rollout_correction import RolloutCorrectionOptions as RC
from tirjax.reporting import benchmark

_JSON = flags.DEFINE_string("json", None, "merge the sections into this JSON file")
_SECTIONS = flags.DEFINE_list("sections", ["gradients"], "sections to run: gradients, vllm")
_SAMPLES = flags.DEFINE_integer("samples", 4096, "gradients: continuations drawn per estimate")
_SEEDS = flags.DEFINE_integer("seeds", 4, "gradients: sampled estimates per correction")
_STEPS = flags.DEFINE_integer("steps", 4, "vllm: RL steps per run")
_SFT_STEPS = flags.DEFINE_integer("sft_steps", 150, "vllm: SFT steps before RL (a policy "
                                  "less uniform than the random one)")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 48, "vllm: max_new_tokens per step")
_VERL_HELPER = flags.DEFINE_string("verl_helper", "", "verl: a verl checkout's "
                                   "verl/trainer/ppo/rollout_corr_helper.py")
_VERL_TORCH_FUNCTIONAL = flags.DEFINE_string("verl_torch_functional", "", "verl: its "
                                             "verl/utils/torch_functional.py")
_VERL_COMMIT = flags.DEFINE_string("verl_commit", "", "verl: the checkout's commit (recorded)")
_VERL_BATCHES = flags.DEFINE_integer("verl_batches", 300, "verl: random batches compared")

UNTRUNCATED = 1e6
CORRECTIONS = {
    "none": None,
    "token_tis_c2": RC(is_level="token", is_threshold=2.0),  # verl decoupled_token_is
    "seq_tis_c2": RC(is_level="sequence", is_threshold=2.0),  # decoupled_seq_is
    "seq_is_untruncated": RC(is_level="sequence", is_threshold=UNTRUNCATED),
    "seq_tis_c2_seq_mis": RC(is_level="sequence", is_threshold=2.0,  # decoupled_seq_is_rs
                             mask_level="sequence", mask_low=0.5, mask_high=2.0),
    "token_tis_c2_geo_mis": RC(is_level="token", is_threshold=2.0,  # decoupled_geo_rs_token_tis
                               mask_level="geometric", mask_low=0.999, mask_high=1.001),
    "seq_mis_only": RC(mask_level="sequence", mask_low=0.5, mask_high=2.0),
}
PERTURBATIONS = {"temperature_0.7": dict(perturbation="temperature", temperature=0.7),
                 "temperature_1.5": dict(perturbation="temperature", temperature=1.5),
                 "bf16_weights": dict(perturbation="bf16")}


def _shares(problem, correction) -> dict:
  """The sampler's expected share of tokens truncated and of rows masked under `correction`."""
  from tirjax.loss import rollout_correction  # pylint: disable=import-outside-toplevel
  if correction is None:
    return {"truncated_token_share": 0.0, "masked_row_share": 0.0}
  c = rollout_correction.correction(problem.old, problem.sampler, problem.loss_mask, correction)
  k = problem.setup.new_tokens
  truncated = np.asarray(c.truncated).sum(axis=1) / k
  return {"truncated_token_share": float(problem.p_sampler @ truncated),
          "masked_row_share": float(problem.p_sampler @ (~np.asarray(c.keep)))}


def _stat(fn, values):
  """`fn` of the values, None where one is None (a zero gradient has no cosine)."""
  return None if any(v is None for v in values) else float(fn(values))


def gradients() -> dict:
  from tirjax.testing import offpolicy_gradients as og  # pylint: disable=import-outside-toplevel
  out = {"setup": {**{k: v for k, v in og.Setup().__dict__.items()
                      if k not in ("perturbation", "temperature")},
                   "prompt": list(og.PROMPT), "samples": _SAMPLES.value, "seeds": _SEEDS.value,
                   "loss": "clipped surrogate at ρ = 1, seq_mean_token_sum",
                   "untruncated_c": UNTRUNCATED},
         "corrections": {name: None if c is None else c.__dict__
                         for name, c in CORRECTIONS.items()},
         "perturbations": {}}
  for pname, kwargs in PERTURBATIONS.items():
    t0 = time.perf_counter()
    problem = og.Problem(og.Setup(**kwargs))
    target = problem.on_policy()
    rows = {}
    for cname, correction in CORRECTIONS.items():
      sampled = [og.compare(problem.sampled(correction, _SAMPLES.value, seed), target)
                 for seed in range(_SEEDS.value)]
      rows[cname] = {
          "expected": og.compare(problem.expected(correction), target),
          "sampled": {f"{k}_{stat}": _stat(fn, [s[k] for s in sampled])
                      for k in ("cosine", "relative_error")
                      for stat, fn in (("mean", np.mean), ("sd", np.std))},
          **_shares(problem, correction)}
    out["perturbations"][pname] = {"sampler": kwargs, "gap": problem.gap(),
                                   "on_policy_grad_norm": float(np.linalg.norm(target)),
                                   "corrections": rows,
                                   "seconds": round(time.perf_counter() - t0, 1)}
    print(pname, json.dumps({c: r["expected"] for c, r in rows.items()}), flush=True)
  return out


VLLM_RUNS = {
    "vllm_float32": ("float32", RC(is_level="sequence", is_threshold=2.0, mask_level="sequence")),
    "vllm_bfloat16": ("bfloat16", RC(is_level="sequence", is_threshold=2.0,
                                     mask_level="sequence")),
    "vllm_bfloat16_tight": ("bfloat16", RC(is_level="token", is_threshold=1.002,
                                           mask_level="geometric", mask_low=0.999,
                                           mask_high=1.001)),
}


def vllm() -> dict:
  # pylint: disable=import-outside-toplevel
  from configs import grpo
  from tirjax.config import set_key
  from tirjax.rundir import RunDir
  from tirjax.testing.short_runs import SHORT
  from tirjax.trainer.train import run
  settings = {**SHORT, "sft.steps": _SFT_STEPS.value, "sft.batch_size": 8,
              "train.queries_per_step": 2, "rollout.n": 4,
              "rollout.max_new_tokens": _NEW_TOKENS.value, "rollout.shapes.max_tokens": 512,
              "train.eval_every": 0, "train.eval_at_start": False, "env.eval_tasks": 1,
              "train.export_final": False, "train.checkpoint_every": 100,
              "sampler.kind": "vllm"}
  out = {"settings": settings, "runs": {}}
  for name, (dtype, correction) in VLLM_RUNS.items():
    c = grpo.get_config(f"model=tiny,steps={_STEPS.value}")
    for key, value in {**settings, "sampler.vllm_dtype": dtype}.items():
      set_key(c, key, value)
    for key, value in correction.__dict__.items():
      set_key(c, f"loss.rollout_correction.{key}", value)
    with tempfile.TemporaryDirectory(prefix="bench-rollout-corr-") as workdir:
      t0 = time.perf_counter()
      run(c, workdir)
      seconds = time.perf_counter() - t0
      steps = [{"step": r["step"], "reward_mean": r["reward/mean"],
                "sampled_tokens": r.get("rollout/sampled_tokens"),
                **{k.removeprefix("rollout_corr/"): v for k, v in r.items()
                   if k.startswith("rollout_corr/")}}
               for r in RunDir(workdir).metrics("rl")]
    out["runs"][name] = {"vllm_dtype": dtype, "trainer_dtype": "float32",
                         "correction": correction.__dict__, "steps": steps,
                         "seconds": round(seconds, 1)}
    print(name, json.dumps(steps[-1]), flush=True)
  return out


def _verl_functions(helper: str, torch_functional: str) -> dict:
  """verl's IS and rejection functions, exec'd from its own files (`--verl_helper`,
  `--verl_torch_functional`): only the functions named below and the constants they read,
  with `verl_F` its `masked_sum` / `masked_mean`. Nothing of verl is copied into tirjax."""
  # pylint: disable=import-outside-toplevel
  import ast
  import math
  import types
  from typing import Any, Optional

  import torch

  def name_of(node):
    if isinstance(node, ast.FunctionDef):
      return node.name
    target = node.targets[0] if isinstance(node, ast.Assign) else node.target
    return target.id if isinstance(target, ast.Name) else None

  def pick(path, names):
    with open(path) as f:
      tree = ast.parse(f.read())
    nodes = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.Assign, ast.AnnAssign))
             and name_of(n) in names]
    missing = set(names) - {name_of(n) for n in nodes}
    if missing:
      raise app.UsageError(f"{path}: no {sorted(missing)}")
    return ast.unparse(ast.Module(body=nodes, type_ignores=[]))

  ns_f = {"torch": torch}
  exec(pick(torch_functional, {"masked_sum", "masked_mean"}), ns_f)  # pylint: disable=exec-used
  verl_f = types.SimpleNamespace(masked_sum=ns_f["masked_sum"], masked_mean=ns_f["masked_mean"])
  ns = {"torch": torch, "math": math, "Optional": Optional, "Any": Any, "verl_F": verl_f}
  exec(pick(helper, {"SAFETY_BOUND", "SUPPORTED_ROLLOUT_RS_OPTIONS",  # pylint: disable=exec-used
                     "TOKEN_LEVEL_ROLLOUT_RS_OPTIONS", "_parse_rollout_rs_thresholds",
                     "compute_rollout_rejection_mask", "compute_rs_metrics",
                     "compute_rollout_correction_weights", "compute_is_metrics"}), ns)
  return ns


def verl() -> dict:
  """tirjax's kernels against verl's own functions on random batches: weights (token and
  sequence level), rows kept (sequence product and geometric mean), the share of tokens
  truncated; mismatches counted, and the largest difference of the weights."""
  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp
  import torch
  from tirjax.loss import rollout_correction
  if not (_VERL_HELPER.value and _VERL_TORCH_FUNCTIONAL.value):
    raise app.UsageError("--sections=verl needs --verl_helper and --verl_torch_functional")
  fns = _verl_functions(_VERL_HELPER.value, _VERL_TORCH_FUNCTIONAL.value)
  rng = np.random.default_rng(0)
  cases = {"token_is": RC(is_level="token", is_threshold=2.0),
           "sequence_is": RC(is_level="sequence", is_threshold=2.0),
           "sequence_mis": RC(mask_level="sequence", mask_low=0.5, mask_high=2.0),
           "geometric_mis": RC(mask_level="geometric", mask_low=0.9, mask_high=1 / 0.9),
           "sequence_mis_asymmetric": RC(mask_level="sequence", mask_low=0.6, mask_high=1.4)}
  out = {name: {"batches": 0, "tokens": 0, "rows": 0, "weight_max_abs_diff": 0.0,
                "weight_mismatches": 0, "row_mismatches": 0,
                "row_mismatches_verl_bounds_inverted": 0,
                "truncated_share_max_abs_diff": 0.0} for name in cases}
  for _ in range(_VERL_BATCHES.value):
    b, length = int(rng.integers(2, 17)), int(rng.integers(1, 33))
    old = rng.normal(-2.0, 1.0, (b, length)).astype(np.float32)
    gap = float(rng.choice([0.01, 0.1, 0.5, 2.0]))
    sampler = (old + rng.normal(0.0, gap, (b, length))).astype(np.float32)
    mask = rng.random((b, length)) < rng.uniform(0.3, 1.0)
    mask[0, 0] = True  # verl refuses a batch without a token
    log_ratio = torch.tensor(old - sampler)
    response_mask = torch.tensor(mask.astype(np.float32))
    seq_rows = mask.any(axis=1)
    for name, opts in cases.items():
      ours = rollout_correction.correction(jnp.asarray(old), jnp.asarray(sampler),
                                           jnp.asarray(mask), opts)
      row = out[name]
      row["batches"] += 1
      row["tokens"] += int(mask.sum())
      row["rows"] += int(seq_rows.sum())
      if opts.is_level != "off":
        w, metrics = fns["compute_rollout_correction_weights"](
            log_ratio, response_mask, rollout_is=opts.is_level,
            rollout_is_threshold=opts.is_threshold)
        diff = np.abs(np.asarray(ours.weights) - w.numpy())[mask]
        row["weight_max_abs_diff"] = max(row["weight_max_abs_diff"], float(diff.max()))
        row["weight_mismatches"] += int((diff > 1e-5 * opts.is_threshold).sum())
        if opts.is_level == "token":
          share = float(np.asarray(ours.truncated)[mask].mean())
          row["truncated_share_max_abs_diff"] = max(
              row["truncated_share_max_abs_diff"],
              abs(share - metrics["rollout_is_ratio_fraction_high"]))
      if opts.mask_level != "off":
        kind = "seq_sum_k1" if opts.mask_level == "sequence" else "seq_mean_k1"
        keep_ours = np.asarray(ours.keep)[seq_rows]
        for key, (lo, hi) in (("row_mismatches", (opts.mask_low, opts.mask_high)),
                              ("row_mismatches_verl_bounds_inverted",
                               (1 / opts.mask_high, 1 / opts.mask_low))):
          modified, _ = fns["compute_rollout_rejection_mask"](
              log_ratio, response_mask, rollout_rs=kind, rollout_rs_threshold=f"{lo}_{hi}")
          keep_verl = (modified.numpy().sum(axis=1) > 0)[seq_rows]
          row[key] += int((keep_ours != keep_verl).sum())
  return {"verl_commit": _VERL_COMMIT.value, "cases": {k: v.__dict__ for k, v in cases.items()},
          "results": out,
          "notes": "row_mismatches: verl given tirjax's [lo, hi] as 'lo_hi'; "
                   "row_mismatches_verl_bounds_inverted: verl given '1/hi_1/lo' (its k1 "
                   "statistic is -log r, so it keeps rows whose 1/r lies in its bounds)"}


SECTIONS = {"gradients": gradients, "vllm": vllm, "verl": verl}


def main(argv) -> dict:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  unknown = set(_SECTIONS.value) - set(SECTIONS)
  if unknown:
    raise app.UsageError(f"--sections: unknown {sorted(unknown)}; known: {sorted(SECTIONS)}")
  results = {}
  if _JSON.value and os.path.exists(_JSON.value):
    with open(_JSON.value) as f:
      results = json.load(f)
  for name in _SECTIONS.value:
    machine = benchmark.machine()
    section = SECTIONS[name]()
    machine["load_average_end"] = list(os.getloadavg())
    results[name] = {**section, "machine": machine}
  print(benchmark.write_result(_JSON.value, results)[-2000:])
  return results


if __name__ == "__main__":
  cli.run(main)
