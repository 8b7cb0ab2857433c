"""Benchmark: the RL update and its log-prob passes, padded against shared/packed (issue 38).

    python -m benchmarks.bench_update --hf_checkpoint=runs/warm/hf_export \\
        --json=benchmarks/results/bench_update_cpu.json

Per case, both variants run the same phases on the same batch, in one process, interleaved
(`--repeats` timed rounds after one that compiles): the reference phase of `experiments.train`
(the KL reference's log-probs when β > 0, π_old recomputed on the tempered policy) and the
update phase (`update_passes`: the config's mini-batches and passes). Reported: seconds per
phase (median), tokens forwarded (positions the model ran, padding included) against the
batch's real tokens, and how far the packed losses and log-probs are from the padded ones.

Cases (`--cases`):
* `default`: a real step's rollouts of `make run`'s config (`configs/hidifftir.py:model=tiny`,
  8 queries × 6 independent rows), sampled by the JAX sampler from the warm start
  `--hf_checkpoint` (step 0's queries), with its estimator, mini-batches and passes.
* `tree`: PORTool's tree rollouts (`configs/portool.py:model=tiny`) of the same queries.
* `tree_coarse`: the same trees (sampled once with `tree`), packed with `step.bucket_steps=2`
  (at most 50% padding, against 25% at the default 4). A tree's forest is ~2.5× an
  independent group's, so its padding costs more. (Since a run's packed shapes only grow,
  finer buckets cost few more compilations: tests/test_packed_update.py counts them.)
* `bfcl_tiny`, `bfcl_100m`: `--bfcl_groups` BFCL multi-turn entries' real prompts (system
  prompt with the function docs, first user turn, rendered with the warm start's tokenizer),
  each a group of `--bfcl_rows` rows with short random responses (16-48 tokens), HiDiffTIR's
  loss (KL 0.001, entropy 0.001), one update; at the tiny model and at a ~100M one (width
  768, 12 layers of 12 heads, SwiGLU 2560, remat). One row per padded micro-batch, so that
  its `[L, L]` attention fits the host; the packed budget is the default 16384 tokens (at
  100M 8192).
  The 100M case uses the first `--bfcl_groups_100m` groups (its padded update takes many
  minutes on 2 cores).
* `synthetic`: `--synthetic` = P,G,n random P-token prompts shared by groups of n rows, at
  model `--preset` (random weights): the same measurement without a warm start or the BFCL
  data, for `benchmarks/gpu/run.sh`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import json
import os
import statistics
import sys
import time

import jax
import numpy as np
from absl import app, flags

from tirjax import cli, distributed, sharding, train_steps
from tirjax.env.chat import render_prompt_ids
from tirjax.models import config as model_config, decoder
from tirjax.reporting import benchmark
from tirjax.trainer import processes, resolve, samplers, tasks as tasks_lib
from tirjax.train_steps.minibatches import update_passes

flags.DEFINE_string("hf_checkpoint", None, "Warm start: an HF export of the tiny model "
                    "(every case but synthetic).")
flags.DEFINE_string("json", "benchmarks/results/bench_update_cpu.json", "Results.")
flags.DEFINE_list("cases", ["default", "tree", "tree_coarse", "bfcl_tiny", "bfcl_100m"],
                  "Cases to run.")
flags.DEFINE_integer("repeats", 3, "Timed rounds per case (after one that compiles).")
flags.DEFINE_integer("repeats_100m", 1, "Timed rounds of the 100M case.")
flags.DEFINE_integer("bfcl_groups", 4, "BFCL entries (groups) of the bfcl cases.")
flags.DEFINE_integer("bfcl_groups_100m", 1, "Of which the 100M case takes the first.")
flags.DEFINE_integer("bfcl_rows", 6, "Rows per BFCL group.")
flags.DEFINE_string("sample_workdir", "runs/bench_update", "Scratch directory of the sampler.")
flags.DEFINE_list("synthetic", ["2048", "4", "8"], "The synthetic case: prompt tokens, "
                  "groups, rows per group.")
flags.DEFINE_string("preset", "tiny", "The synthetic case's model preset.")
FLAGS = flags.FLAGS

# Issue 38: update + reference at least this many times faster packed than padded.
TARGETS = {"default": 2.0, "tree": 3.0, "tree_coarse": 3.0, "bfcl_tiny": 4.0, "bfcl_100m": 4.0}
MODEL_100M = dict(hidden_size=768, intermediate_size=2560, num_layers=12, num_heads=12,
                  num_kv_heads=12, head_dim=64, remat=True)


def experiment(config_arg: str, **overrides):
  name, _, arg = config_arg.partition(":")
  cfg = importlib.import_module(f"configs.{name}").get_config(arg or None)
  cfg.model.hf_checkpoint = FLAGS.hf_checkpoint or ""
  cfg.sft.steps = 0
  for key, value in overrides.items():
    section, field = key.split(".")
    cfg[section][field] = value
  return resolve.resolve(cfg)


def sampled_case(config_arg: str) -> dict:
  """Step 0's rollouts of `config_arg` from the warm start, as `experiments.train` samples
  them (its own sampling function), with their advantages."""
  from tirjax.trainer import parts, stages  # pylint: disable=import-outside-toplevel
  exp = experiment(config_arg)
  mesh, exp = parts.mesh(exp)
  share = processes.StepShare.of(mesh, exp.sharding.rules, exp.rollout,
                                 exp.train.queries_per_step)
  with contextlib.ExitStack() as cleanup:
    data = parts.data(exp, cleanup)
    graphdef, params, phases = parts.model(exp, len(data.tokenizer), mesh)
    state = train_steps.init_state(params, phases["rl"].tx, phases["rl"].place, jax.random.key(0))
    sampler = samplers.make_sampler(exp.sampler, exp.step.logprob_chunk_size, graphdef, state,
                                    FLAGS.sample_workdir, data.tokenizer_dir, share.rollout)
    cleanup.callback(sampler.close)
    trainer = parts.Trainer(exp, FLAGS.sample_workdir, data, graphdef, phases, share, sampler,
                            None, None, None)
    r = stages.sample(trainer, 0).rollouts
  adv = exp.estimator(r, exp.advantage)
  return dict(exp=exp, graphdef=graphdef, params=params, batch=train_steps.policy_batch(r, adv),
              group_id=np.asarray(r.group_id), row_valid=np.asarray(r.row_valid))


def bfcl_case(groups: int, big: bool) -> dict:
  """Real BFCL prompts, `--bfcl_rows` rows each with 16-48 random response tokens."""
  exp = experiment("hidifftir:model=tiny,env=bfcl")
  tokenizer = tasks_lib.load_tokenizer(FLAGS.hf_checkpoint)
  source = tasks_lib.TaskSource(exp.env, seed=0)
  try:
    prompts = [render_prompt_ids(tokenizer, t, t.question, exp.rollout.answer_protocol)
               for t in source.tasks("train", FLAGS.bfcl_groups)[:groups]]
  finally:
    source.close()
  cfg = model_config.tiny(vocab_size=len(tokenizer), **(MODEL_100M if big else
                                                       dict(exp.model.tiny)))
  return prompt_case(exp, cfg, prompts, FLAGS.bfcl_rows, big)


def synthetic_case() -> dict:
  """`--synthetic` = P,G,n: G groups of n rows sharing a random P-token prompt, at model
  `--preset` (randomly initialised; `tiny` is the CPU default's sizes): a BFCL-like batch
  without a warm start or the BFCL data (`benchmarks/gpu/run.sh`)."""
  p, g, n = (int(x) for x in FLAGS.synthetic)
  exp = experiment("hidifftir:model=tiny")
  rng = np.random.default_rng(1)
  if FLAGS.preset == "tiny":
    cfg = model_config.tiny(vocab_size=4096, **dict(exp.model.tiny))
  else:
    cfg = model_config.preset(FLAGS.preset, remat=True)
  prompts = [rng.integers(5, cfg.vocab_size, p) for _ in range(g)]
  return prompt_case(exp, cfg, prompts, n, big=FLAGS.preset != "tiny")


def prompt_case(exp, cfg, prompts, n: int, big: bool) -> dict:
  """Groups of `n` rows sharing each prompt, each with 16-48 random response tokens, random
  advantages; one update (HiDiffTIR's loss: the KL reference pass, then the update)."""
  rng = np.random.default_rng(0)
  lengths = [len(p) + int(rng.integers(16, 49)) for p in prompts for _ in range(n)]
  rows, width = len(lengths), -(-max(lengths) // 128) * 128
  tokens = np.zeros((rows, width), np.int32)
  loss_mask = np.zeros((rows, width), bool)
  for b, length in enumerate(lengths):
    prompt = prompts[b // n]
    tokens[b, :len(prompt)] = prompt
    tokens[b, len(prompt):length] = rng.integers(5, cfg.vocab_size, length - len(prompt))
    loss_mask[b, len(prompt):length] = True
  valid = np.arange(width)[None] < np.asarray(lengths)[:, None]
  adv = rng.standard_normal(rows)[:, None] * loss_mask
  batch = train_steps.PolicyBatch(
      tokens=tokens, token_valid=valid, loss_mask=loss_mask,
      old_logprobs=np.where(loss_mask, -np.log(cfg.vocab_size), 0).astype(np.float32),
      advantages=adv.astype(np.float32), row_mask=np.ones(rows, bool))
  graphdef, params = train_steps.split_model(decoder.init(cfg, seed=0))
  exp = dataclasses.replace(exp, train=dataclasses.replace(exp.train, mini_batch_queries=0,
                                                           tempered_policy=False))
  return dict(exp=exp, graphdef=graphdef, params=params, batch=batch,
              group_id=np.repeat(np.arange(len(prompts)), n), row_valid=np.ones(rows, bool),
              padded_microbatches=rows, packed_budget=8192 if big else None,
              params_count=sum(x.size for x in jax.tree.leaves(params)))


def variant_options(case: dict, packed: bool) -> train_steps.StepOptions:
  step = dataclasses.replace(case["exp"].step, packed=packed)
  if packed and case.get("packed_budget"):
    step = dataclasses.replace(step, max_tokens_per_microbatch=case["packed_budget"])
  if packed and case.get("bucket_steps"):
    step = dataclasses.replace(step, bucket_steps=case["bucket_steps"])
  if not packed:
    step = dataclasses.replace(step, num_microbatches=case.get("padded_microbatches", 1))
  return step


class Variant:
  """One variant's jitted step and log-prob passes, built once (rounds reuse them)."""

  def __init__(self, case: dict, packed: bool):
    exp, graphdef = case["exp"], case["graphdef"]
    self.case, self.packed = case, packed
    opts = variant_options(case, packed)
    self.tx = train_steps.make_optimizer(exp.optim)
    self.place = train_steps.placement(case["params"], self.tx, sharding.make_mesh(exp.sharding))
    self.step = train_steps.policy_step(graphdef, self.tx, self.place, exp.loss, opts)
    self.reference = (train_steps.ReferencePolicy(graphdef, case["params"], self.place, opts)
                      if exp.loss.kl_coef > 0 else None)
    self.own = (train_steps.TokenLogprobs(graphdef, self.place, opts)
                if exp.train.tempered_policy else None)

  def run(self) -> dict:
    """The reference phase and the update phase of one RL step, as `experiments.train` runs
    them, from the case's parameters."""
    case, exp = self.case, self.case["exp"]
    state = train_steps.init_state(case["params"], self.tx, self.place, jax.random.key(0))
    b, gid = case["batch"], case["group_id"]
    start = time.perf_counter()
    passes, forwarded = {}, 0
    for name, fn in (("ref_logprobs", self.reference and self.reference.fn),
                     ("old_logprobs", self.own)):
      if fn is not None:
        params = self.reference.params if name == "ref_logprobs" else state.params
        passes[name] = np.asarray(jax.block_until_ready(fn(params, b.tokens, b.token_valid,
                                                           gid, b.loss_mask)))
        forwarded += fn.packed.last_shapes.forwarded if self.packed else b.tokens.size
    batch = b.replace(**passes)
    ref_s = time.perf_counter() - start
    start = time.perf_counter()
    state, updates = update_passes(state, self.step, batch, gid, case["row_valid"],
                                   exp.train.num_minibatches, exp.train.ppo_epochs, seed=0,
                                   step=0)
    update_s = time.perf_counter() - start
    return dict(reference_s=ref_s, update_s=update_s, passes=passes,
                pass_tokens_forwarded=forwarded,
                update_tokens_forwarded=sum(float(u["tokens/forwarded"]) for u in updates),
                losses=[float(u["loss"]) for u in updates],
                grad_norms=[float(u["grad_norm"]) for u in updates])


def measure(name: str, case: dict, repeats: int) -> dict:
  runs = {False: [], True: []}
  variants = {packed: Variant(case, packed) for packed in (False, True)}
  for i in range(repeats + 1):  # round 0 compiles
    for packed in (False, True):
      out = variants[packed].run()
      out["load_average"] = os.getloadavg()[0]  # the shared machine's 1-minute load after it
      print(f"{name} {'packed' if packed else 'padded'} round {i}: reference "
            f"{out['reference_s']:.2f} s, update {out['update_s']:.2f} s", flush=True)
      runs[packed].append(out)
  b = case["batch"]
  result = {"rows": int(np.sum(case["row_valid"])), "groups": len(np.unique(case["group_id"])),
            "real_tokens": int(np.sum(b.token_valid)), "batch_shape": list(b.tokens.shape),
            "update_passes": case["exp"].train.num_minibatches * case["exp"].train.ppo_epochs,
            "packed_bucket_steps": variant_options(case, True).bucket_steps}
  for packed, label in ((False, "padded"), (True, "packed")):
    timed = runs[packed][1:]
    med = lambda k, t=timed: statistics.median(r[k] for r in t)
    result[label] = dict(
        reference_s=med("reference_s"), update_s=med("update_s"),
        total_s=med("reference_s") + med("update_s"),
        compile_round_s=runs[packed][0]["reference_s"] + runs[packed][0]["update_s"],
        pass_tokens_forwarded=timed[0]["pass_tokens_forwarded"],
        update_tokens_forwarded=timed[0]["update_tokens_forwarded"],
        losses=timed[0]["losses"], grad_norms=timed[0]["grad_norms"],
        rounds=[{k: r[k] for k in ("reference_s", "update_s", "load_average")} for r in timed])
  pad, pack = runs[False][1], runs[True][1]
  result["speedup_total"] = result["padded"]["total_s"] / result["packed"]["total_s"]
  if name in TARGETS:  # issue 38's targets, update + reference
    result["target"] = TARGETS[name]
    result["meets_target"] = result["speedup_total"] >= TARGETS[name]
  result["speedup_update"] = result["padded"]["update_s"] / result["packed"]["update_s"]
  result["forwarded_ratio"] = ((result["padded"]["pass_tokens_forwarded"]
                                + result["padded"]["update_tokens_forwarded"])
                               / (result["packed"]["pass_tokens_forwarded"]
                                  + result["packed"]["update_tokens_forwarded"]))
  result["first_update_loss_rel_diff"] = abs(pack["losses"][0] - pad["losses"][0]) / max(
      abs(pad["losses"][0]), 1e-12)
  result["first_update_grad_norm_rel_diff"] = abs(
      pack["grad_norms"][0] - pad["grad_norms"][0]) / max(pad["grad_norms"][0], 1e-12)
  generated = np.asarray(b.loss_mask, bool)  # the packed passes fill these only
  result["pass_logprobs_max_abs_diff"] = {
      k: float(np.max(np.abs(pack["passes"][k] - pad["passes"][k])[generated]))
      for k in pad["passes"]}
  if "params_count" in case:
    result["params"] = case["params_count"]
  return result


def main(argv):
  del argv
  distributed.initialize(distributed.DistributedOptions())
  info = benchmark.machine()
  start = time.perf_counter()
  if set(FLAGS.cases) - {"synthetic"} and not FLAGS.hf_checkpoint:
    raise app.UsageError("--hf_checkpoint (the warm start) is required by every case but "
                         "synthetic")
  trees = functools.cache(lambda: sampled_case("portool:model=tiny"))
  makers = {"synthetic": synthetic_case,
            "default": lambda: sampled_case("hidifftir:model=tiny"),
            "tree": trees,
            "tree_coarse": lambda: dict(trees(), bucket_steps=2),
            "bfcl_tiny": lambda: bfcl_case(FLAGS.bfcl_groups, big=False),
            "bfcl_100m": lambda: bfcl_case(FLAGS.bfcl_groups_100m, big=True)}
  unknown = sorted(set(FLAGS.cases) - set(makers))
  if unknown:
    raise app.UsageError(f"--cases: unknown {unknown}; known: {sorted(makers)}")
  out = dict(command="python -m benchmarks.bench_update " + " ".join(sys.argv[1:]),
             machine=info, cases={})
  for name in FLAGS.cases:
    case = makers[name]()
    repeats = FLAGS.repeats_100m if name == "bfcl_100m" else FLAGS.repeats
    if name == "synthetic":
      out["synthetic"] = dict(prompt=FLAGS.synthetic, preset=FLAGS.preset)
    out["cases"][name] = measure(name, case, repeats)
    print(json.dumps({name: {k: v for k, v in out["cases"][name].items()
                             if k not in ("padded", "packed")}}, indent=1), flush=True)
  out["seconds"] = round(time.perf_counter() - start, 1)
  benchmark.write_result(FLAGS.json, out, indent=1)


if __name__ == "__main__":
  cli.run(main)
