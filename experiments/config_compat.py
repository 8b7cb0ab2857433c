"""Issue 29's check: every config × preset resolves to the same options before and after the
config keys moved to the sections of their options (`step`, `sft.demos`, `exp.seed`, one
`exp.sft`).

    git archive 70035f3 | (mkdir -p /tmp/base70035f3 && tar -x -C /tmp/base70035f3)
    python -m experiments.config_compat --base=/tmp/base70035f3

Each tree (this one and `--base`) resolves, in its own subprocess, every estimator config ×
every preset combination (model × env × sampler × rollout, with mesh=1x1x1,steps=2) and every
job of every ablation grid (`configs/ablate.py`, whose cells `configs/cell.py` rebuilds);
each `Experiment` becomes {dotted field: value}. The base tree's fields are renamed
(`RENAMED_FIELDS`) and the two compared: the same values, or the same error, for every case.
Presets that cannot resolve as built (a real model without a checkpoint, SFT on an env without
demonstrations) are compared once as built (the same error) and once with a checkpoint
directory and sft.steps=0 (the same values).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

from absl import app, flags

# Fields of the base tree's `Experiment` (or of its sections) and where they are now.
RENAMED_FIELDS = {
    "train.micro_batches": "step.num_microbatches",
    "train.log_entropy": "step.log_entropy",
    "model.logprob_chunk": "step.logprob_chunk_size",
    "sft.p_recover": "sft.demos.p_recover",
    "sft.p_detour": "sft.demos.p_detour",
    "sft.p_reorder": "sft.demos.p_reorder",
    "sft.p_confuse": "sft.demos.p_confuse",
}
RENAMED_PREFIXES = {"sft_optim.": "sft.optim.", "sft_loss.": "sft.loss.",
                    "sft_step.": "sft.step.", "demos.": "sft.demos."}
ESTIMATOR_CONFIGS = ("arpo", "dapo", "dr_grpo", "ftrl", "gigpo", "gpg", "grpo", "grpo_fm",
                     "grpo_passk", "hidifftir", "matchtir_km", "matchtir_ot", "opo", "portool",
                     "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "rloo",
                     "toolrl", "tree_grpo")
DEMO_ENVS = ("toolworld", "doors")


def new_name(old: str) -> str:
  if old in RENAMED_FIELDS:
    return RENAMED_FIELDS[old]
  for prefix, new in RENAMED_PREFIXES.items():
    if old.startswith(prefix):
      return new + old[len(prefix):]
  return old


def flatten(obj: Any, prefix: str = "") -> dict:
  """{dotted field: JSON value} of a tree of dataclasses, mappings and values."""
  if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
    if hasattr(obj, "fn") and hasattr(obj, "needs"):  # an advantages.Estimator
      return {f"{prefix}name": obj.name, f"{prefix}needs": list(obj.needs),
              f"{prefix}options": obj.options.__name__}
    out = {}
    for f in dataclasses.fields(obj):
      out.update(flatten(getattr(obj, f.name), f"{prefix}{f.name}."))
    return out
  if isinstance(obj, dict) or hasattr(obj, "items"):
    out = {}
    for k, v in dict(obj.items()).items():
      out.update(flatten(v, f"{prefix}{k}."))
    return out or {prefix.rstrip("."): {}}
  if isinstance(obj, (tuple, list)):
    return {prefix.rstrip("."): json.loads(json.dumps(obj, default=repr))}
  if obj is None or isinstance(obj, (bool, int, float, str)):
    return {prefix.rstrip("."): obj}
  return {prefix.rstrip("."): repr(obj)}


def _cases():
  """(case id, config module, preset argument, fix-ups) of every estimator config × preset."""
  from configs import base  # the tree's own preset values  # pylint: disable=import-outside-toplevel
  for name, model, env, sampler, mode in itertools.product(
      ESTIMATOR_CONFIGS, base.PRESET_KEYS["model"], base.PRESET_KEYS["env"],
      base.PRESET_KEYS["sampler"], base.PRESET_KEYS["rollout"]):
    arg = f"model={model},env={env},sampler={sampler},rollout={mode},mesh=1x1x1,steps=2"
    if model == "tiny":
      yield f"{name}:{arg}:built", name, arg, False
    yield f"{name}:{arg}:fixed", name, arg, True


def _fix(c, data_root: str) -> None:
  """What a preset needs to resolve on this machine: a checkpoint directory for real models
  and envs without demonstrations (then no SFT), and the data files (relative to the
  directory the check runs from, as the configs' paths are)."""
  if c.model.preset != "tiny" or c.env.name not in DEMO_ENVS:
    c.model.hf_checkpoint = "."
  if c.env.name not in DEMO_ENVS:
    c.sft.steps = 0
  if c.env.data_path:
    c.env.data_path = os.path.normpath(os.path.join(data_root, c.env.data_path))


def _warm_started(c):
  """A grid cell's config as if its warm start had run: its export (the job's `needs`,
  compared as such) stands in as a checkpoint directory that exists."""
  if c.model.hf_checkpoint and not os.path.isdir(c.model.hf_checkpoint):
    c.model.hf_checkpoint = "."
  return c


def _outcome(build) -> dict:
  from tirjax.trainer import resolve  # pylint: disable=import-outside-toplevel
  try:
    config = build()
    exp = resolve.resolve(config)
  except Exception as e:  # pylint: disable=broad-except
    return {"error": f"{type(e).__name__}: {e}"}
  flat = flatten(exp)
  flat.setdefault("seed", config.seed)  # the base tree's Experiment has no seed
  return {"values": flat}


def worker(out: str, data_root: str, only: str = "") -> None:
  """Resolves every case (whose id contains `only`) with the `tirjax` and `configs` on
  sys.path; writes JSON to `out`."""
  import importlib  # pylint: disable=import-outside-toplevel
  from configs import ablate  # pylint: disable=import-outside-toplevel
  from tirjax import ablation  # pylint: disable=import-outside-toplevel
  results = {}
  for case, name, arg, fix in _cases():
    if only not in case:
      continue
    def build(name=name, arg=arg, fix=fix):
      c = importlib.import_module(f"configs.{name}").get_config(arg)
      if fix:
        _fix(c, data_root)
      return c
    results[case] = _outcome(build)
  grids = ablate.GRIDS if not only or only.startswith("ablate:") else ()
  for grid in grids:
    for job in ablation.plan(ablate.get_config(f"grid={grid}"), "/tmp/config_compat_grid"):
      if only not in f"ablate:{grid}:{job.name}":
        continue
      results[f"ablate:{grid}:{job.name}"] = {
          **_outcome(lambda job=job: _warm_started(ablation.build_config(job.recipe))),
          "job": [job.label, job.workdir, job.needs]}
  with open(out, "w") as f:
    json.dump(results, f)


def _run_worker(tree: str, only: str) -> dict:
  with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
    out = f.name
  env = {**os.environ, "PYTHONPATH": tree, "JAX_PLATFORMS": "cpu"}
  # -P: the tree's packages, not those of the directory this file is in; run in the tree so
  # that its relative paths (data files, the grids' config files) are its own.
  subprocess.run([sys.executable, "-P", os.path.abspath(__file__), f"--worker={out}",
                  f"--data_root={os.getcwd()}", f"--only={only}"], cwd=tree, env=env,
                 check=True)
  with open(out) as f:
    results = json.load(f)
  os.remove(out)
  return results


def _renamed(values: dict) -> tuple[dict, list[str]]:
  """The base tree's fields under their new names; the fields that renamed onto one key with
  different values (the old `sft.p_*` and `demos.p_*` must agree)."""
  out, clashes = {}, []
  for key, value in values.items():
    new = new_name(key)
    if new in out and out[new] != value:
      clashes.append(new)
    out[new] = value
  return out, clashes


def compare(base: dict, head: dict) -> list[str]:
  """Every difference between the two trees' results, as lines."""
  problems = []
  for case in sorted(set(base) | set(head)):
    if case not in base or case not in head:
      problems.append(f"{case}: only in {'head' if case in head else 'base'}")
      continue
    b, h = base[case], head[case]
    if b.get("job") != h.get("job"):
      problems.append(f"{case}: job {b.get('job')} -> {h.get('job')}")
    if ("error" in b) != ("error" in h) or b.get("error") != h.get("error"):
      problems.append(f"{case}: {b.get('error', 'resolves')} -> {h.get('error', 'resolves')}")
      continue
    if "values" not in b:
      continue
    old, clashes = _renamed(b["values"])
    problems += [f"{case}: base fields renamed onto {k} disagree" for k in clashes]
    new = h["values"]
    for key in sorted(set(old) | set(new)):
      if old.get(key, "<absent>") != new.get(key, "<absent>"):
        problems.append(f"{case}: {key}: {old.get(key, '<absent>')!r} -> "
                        f"{new.get(key, '<absent>')!r}")
  return problems


flags.DEFINE_string("base", None, "a checkout of the commit before the change")
flags.DEFINE_string("worker", None, "(internal) resolve this tree's cases into this JSON file")
flags.DEFINE_string("data_root", None, "(internal) where relative data paths are read from")
flags.DEFINE_string("only", "", "only the cases whose id contains this")


def main(argv) -> None:
  if len(argv) > 1:  # (app.run, not tirjax.cli: the worker also runs in older trees)
    sys.exit(f"config_compat: unexpected arguments: {argv[1:]}")
  args = flags.FLAGS
  if args.worker:
    worker(args.worker, args.data_root, args.only)
    return
  head_tree = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  base, head = _run_worker(args.base, args.only), _run_worker(head_tree, args.only)
  problems = compare(base, head)
  resolved = sum("values" in r for r in head.values())
  print(f"{len(head)} cases ({resolved} resolve, {len(head) - resolved} refused the same way "
        f"by both trees): {len(problems)} differences")
  refusals = collections.Counter(r["error"].split(":")[1].strip() if ":" in r["error"] else
                                 r["error"] for r in head.values() if "error" in r)
  for key, count in refusals.most_common():
    print(f"  refused: {key}: {count}")
  for line in problems[:50]:
    print("  " + line)
  sys.exit(1 if problems else 0)


if __name__ == "__main__":
  app.run(main)
