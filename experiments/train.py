"""Train a tool-using agent: supervised warm-start, then agentic RL with a registered estimator.

    python -m experiments.train --config=configs/hidifftir.py:model=tiny --workdir=runs/default

Restarting with the same --workdir resumes from the last checkpoint (same data order, PRNG
streams and policy version). The workdir receives config.json, status.json, metrics.jsonl,
TensorBoard events, checkpoints/ and hf_export/ (see `tirjax.rundir`).

Several processes (hosts) run the same command with `distributed.*` set (`tirjax.distributed`,
docs/scaling.md): each samples its share of a step's queries, the update runs on the global
batch, and process 0 writes the run directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
from typing import Optional

import jax
import numpy as np
from absl import app, flags, logging
from flax import nnx
from ml_collections import config_flags

from tirjax import distributed, rundir, sharding
from tirjax.checkpoint import CheckpointOptions, Checkpointer
from tirjax.episodes import judging
from tirjax.trainer import refill, resolve, samplers, weights
from tirjax.trainer.direction import direction_preference
from tirjax.trainer.evaluation import evaluate
from tirjax.trainer.progress import Progress, summary_table
from tirjax.trainer.rl_metrics import PhaseClock, rl_metrics
from tirjax.trainer.sft_data import SFTData
from tirjax.trainer import tasks as tasks_lib
from tirjax.trainer.tasks import TaskSource, load_tokenizer, tokenizer_dir
from tirjax.models.hf_io import export_hf
from tirjax.episodes import rollout
from tirjax.rollouts import Rollouts
from tirjax.training.batches import SFTBatch, longest_row, policy_batch, trim_tokens
from tirjax.training.minibatches import combine_updates, update_passes
from tirjax.training.optimizer import make_optimizer
from tirjax.training.reference import (ReferencePolicy, TokenLogprobs, with_policy_logprobs,
                                      with_reference_logprobs)
from tirjax.training.step import init_state, placement, policy_step, sft_step, split_model

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Experiment config, e.g. configs/portool.py:model=tiny",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Run directory (created, or resumed when it holds this run).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # Orbax logs every save at INFO
  config, workdir = FLAGS.config, FLAGS.workdir
  run(config, workdir)


def run(config, workdir: str) -> dict:
  """The whole run; returns the final summary (also printed and written to summary.json)."""
  # -- Set-up and logging ---------------------------------------------------------------------
  distributed.initialize(resolve.distributed_options(config))  # before anything touches JAX
  exp = resolve.resolve(config)  # every value checked before any compute
  record = resolve.config_record(config)  # config.json, the run's id, the loggers' config
  primary = distributed.is_primary()  # process 0 writes the run directory
  claim_error = None
  if primary:
    try:
      resuming = rundir.claim(workdir, record)
    except rundir.WorkdirMismatch as e:
      claim_error, resuming = e, False
  if not distributed.agree(claim_error is None):
    raise claim_error or rundir.WorkdirMismatch(f"{workdir}: refused by process 0")
  resuming = distributed.agree(resuming if primary else False)
  if primary:
    rundir.write_status(workdir, "running", 0)
    if not os.path.exists(os.path.join(workdir, "cell.json")):
      rundir.write_json(os.path.join(workdir, "cell.json"), dict(
          label=exp.estimator.name, estimator=exp.estimator.name,
          options=dataclasses.asdict(exp.advantage), seed=exp.seed))
  writer = (rundir.MetricsWriter(workdir, exp.train.loggers, rundir.run_id(record), record)
            if primary else rundir.NullWriter())
  progress = Progress(enabled=exp.train.progress_bar, quiet=not primary)
  try:
    with contextlib.ExitStack() as cleanup:  # sampler, checkpointer, tasks: closed however it ends
      summary = _train(exp, workdir, rundir.run_id(record), writer, progress, resuming, cleanup)
    writer.summarize(summary)
  except BaseException as e:  # record the failure (Ctrl-C included), then re-raise
    if primary:
      rundir.write_status(workdir, "failed", progress.step, f"{type(e).__name__}: {e}")
    raise
  finally:
    progress.close()
    writer.close()
  if primary:
    rundir.write_status(workdir, "finished", exp.train.steps)
  return summary


def _exists(path: str) -> bool:
  """Whether `path` exists, as process 0 sees it (every process then takes the same branch)."""
  return bool(distributed.agree(os.path.exists(path)))


def _write_json(path: str, obj) -> None:
  if distributed.is_primary():
    rundir.write_json(path, obj)


def _global_rollouts(local: Rollouts, share: distributed.RowShare, mesh, rules) -> Rollouts:
  """The step's batch from every process's rows: the batch-global segment ids (`group_id`,
  `node_id`) move to this process's block first."""
  if not distributed.is_multiprocess():
    return local
  node = np.asarray(local.node_id)
  local = local.replace(group_id=np.asarray(local.group_id) + share.start,
                        node_id=np.where(node >= 0, node + share.start * local.max_steps, node))
  if local.state_id is not None:  # anchor states (GiGPO) are batch-global like node ids
    state = np.asarray(local.state_id)
    local = local.replace(state_id=np.where(state >= 0, state + share.start * local.max_steps,
                                            state))
  return sharding.shard_batch(local, mesh, rules)  # the global arrays


def _train(exp: resolve.Experiment, workdir, run_id, writer, progress, resuming,
           cleanup: contextlib.ExitStack) -> dict:
  # -- Mesh -----------------------------------------------------------------------------------
  mesh = sharding.make_mesh(exp.sharding)
  rules = exp.sharding.rules
  batch_axes = sharding.batch_spec(rules)[0] or ()
  shards = int(np.prod([mesh.shape[a] for a in (batch_axes if isinstance(batch_axes, tuple)
                                                 else (batch_axes,))]))
  exp = resolve.fit_to_mesh(exp, shards, exp.sft.batch_size if exp.sft.steps else shards)
  # This process's rows of each step's batch (all of them with one process), and the rollout
  # options of its share.
  share = distributed.row_share(mesh, rules, exp.rollout.shapes.num_rows)
  local_rollout = dataclasses.replace(exp.rollout, shapes=dataclasses.replace(
      exp.rollout.shapes, num_rows=share.stop - share.start))
  per_process = exp.train.queries_per_step // share.count

  # -- Data and environment -------------------------------------------------------------------
  def build_tokenizer():
    return tokenizer_dir(exp.model, exp.env.name, tasks_lib.cache_dir(exp.env.cache_dir),
                         seed=exp.seed)
  if distributed.is_primary():  # built once (a shared cache), then found by the others
    build_tokenizer()
  distributed.barrier("tokenizer")
  tok_dir = build_tokenizer()
  tokenizer = load_tokenizer(tok_dir)
  source = cleanup.enter_context(contextlib.closing(TaskSource(exp.env, seed=exp.seed)))
  train_tasks = source.tasks("train", exp.env.train_tasks)
  eval_tasks = source.tasks("eval", exp.env.eval_tasks)
  # SFT demonstrates other train-split tasks than RL asks: RL's gains are on queries whose
  # answers SFT did not show (with the same tasks, RL only re-reads what SFT memorised).
  demo_tasks = source.tasks("train", exp.env.train_tasks + exp.sft.num_demos,
                            hop_weights=exp.sft.hop_weights)[
      exp.env.train_tasks:] if exp.sft.steps else []
  judge = judging.make_judge(exp.judge)
  queries = tasks_lib.QueryOrder(len(train_tasks), exp.train.queries_per_step, seed=exp.seed)

  # -- Model and optimizer --------------------------------------------------------------------
  model = weights.build_model(exp.model, len(tokenizer), rules, seed=exp.seed)
  graphdef, params = split_model(model)
  sft_tx, rl_tx = make_optimizer(exp.sft.optim), make_optimizer(exp.optim)
  place = {"sft": placement(params, sft_tx, mesh, rules), "rl": placement(params, rl_tx, mesh, rules)}
  steps = {"sft": sft_step(graphdef, sft_tx, place["sft"], exp.sft.loss, exp.sft.step),
           "rl": policy_step(graphdef, rl_tx, place["rl"], exp.loss, exp.step)}
  tx = {"sft": sft_tx, "rl": rl_tx}

  # -- Checkpoint restore ---------------------------------------------------------------------
  ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), run_id=run_id,
                      options=CheckpointOptions(max_to_keep=exp.train.keep_checkpoints),
                      on_commit=writer.checkpointed)
  cleanup.callback(ckpt.close)
  phase = "sft" if exp.sft.steps > 0 else "rl"
  state = init_state(params, tx[phase], place[phase], jax.random.key(exp.seed),
                     data_position={"phase": phase, "sft_step": 0, "rl_step": 0})
  if ckpt.latest_step() is not None:
    def target(meta):  # the saved phase decides the optimizer state's structure
      saved = meta["data_position"]["phase"]
      return init_state(params, tx[saved], place[saved], jax.random.key(exp.seed))
    state = ckpt.restore(target)  # the newest intact checkpoint; corrupt ones are named
    phase = state.data_position["phase"]
    writer.truncate_after(rundir.phase_steps(state.data_position))
    if distributed.is_primary():
      print(f"resumed {workdir} at {phase} step "
            f"{state.data_position[phase + '_step']} (policy version {state.policy_version})")
  elif resuming:
    writer.truncate_after({"sft": 0, "rl": 0, "eval": -1})
  del model, params  # the train state owns the (donated) parameter buffers from here on
  sampler = samplers.make_sampler(exp.sampler, exp.step.logprob_chunk_size, graphdef, state, workdir, tok_dir,
                                   local_rollout)
  cleanup.callback(sampler.close)

  run_clock = PhaseClock()  # this process's seconds in SFT, RL and evaluation (summary.json)

  eval_start, eval_stop = distributed.task_block(len(eval_tasks))
  mine = eval_stop - eval_start  # the eval tasks this process runs

  def evaluate_now() -> dict:
    """Hands the current weights to the sampler and evaluates them (greedy by default); on
    toolworld also the policy's preference for the directions its questions state."""
    with run_clock("eval"):
      params = weights.sampler_params(state)
      sampler.update(params, state.policy_version)
      result = evaluate(sampler, tokenizer, eval_tasks, exp.rollout, judge,
                        exp.sampler.eval_temperature, seed=exp.seed,
                        progress=progress.evaluation(mine),
                        answer_in_tool_message=exp.env.answer_in_tool_message,
                        samples=exp.sampler.eval_samples)
      if exp.env.name == "toolworld":
        result.update(direction_preference(nnx.merge(graphdef, params), tokenizer, eval_tasks,
                                           exp.rollout.answer_protocol))
      return result

  def evaluate_and_log(step: int, stage: Optional[str] = None) -> dict:
    """`evaluate_now`, written as the metrics' eval row `step`; with `stage` ("sft": after the
    warm start, "start": before RL without one) also the run's first evaluation."""
    result = evaluate_now()  # each process runs its block of the tasks; all get every metric
    if stage is not None:
      _write_json(os.path.join(workdir, "eval_after_sft.json"), result)
    writer.write("eval", step, {**result, "eval/stage": stage} if stage else result)
    return result

  # -- Supervised warm-start ------------------------------------------------------------------
  if phase == "sft":
    data = SFTData.from_sequences(
        source.demonstrations(demo_tasks, tokenizer, exp.sft.demos, exp.sft.num_demos),
        exp.rollout.shapes.max_tokens, seed=exp.seed)
    progress.start("sft", exp.sft.steps, state.data_position["sft_step"])
    sft_start = time.perf_counter()
    while state.data_position["sft_step"] < exp.sft.steps:
      i = state.data_position["sft_step"]
      state, metrics = steps["sft"](state, SFTBatch(**data.batch(i, exp.sft.batch_size)))
      state = dataclasses.replace(state, data_position={**state.data_position, "sft_step": i + 1})
      rec = writer.write("sft", i + 1, jax.device_get(metrics))
      progress.update(i + 1, loss=rec["loss"])
      if (i + 1) % exp.train.checkpoint_every == 0 and i + 1 < exp.sft.steps:
        ckpt.save(state)
    run_clock.seconds["sft"] = time.perf_counter() - sft_start
    # SFT is done: evaluate, then start RL with a fresh optimizer (one checkpoint marks it).
    evaluate_and_log(0, stage="sft")
    phase = "rl"
    state = init_state(state.params, rl_tx, place["rl"], state.rng, step=state.step,
                       data_position={**state.data_position, "phase": "rl"},
                       policy_version=state.policy_version)
    ckpt.save(state)
  elif (exp.train.eval_at_start and state.data_position["rl_step"] == 0
        and not _exists(os.path.join(workdir, "eval_after_sft.json"))):
    evaluate_and_log(0, stage="start")

  # -- RL loop: sample, execute, judge, Rollouts, advantages, update, hand-over, evaluate ----
  reference = None
  if exp.loss.kl_coef > 0:  # the KL reference: the policy as RL starts (kept across restarts)
    reference = ReferencePolicy(graphdef, weights.reference_params(state, workdir),
                                place["rl"], exp.step)
  own_logprobs = (TokenLogprobs(graphdef, place["rl"], exp.step)
                  if exp.train.tempered_policy else None)
  progress.start("rl", exp.train.steps, state.data_position["rl_step"])
  last_eval = None
  rl_start, eval_before_rl = time.perf_counter(), run_clock.seconds.get("eval", 0.0)
  while state.data_position["rl_step"] < exp.train.steps:
    i = state.data_position["rl_step"]
    clock = PhaseClock()  # every phase waited on before its clock stops (asynchronous dispatch)
    with clock("handover"):
      sampler.update(weights.sampler_params(state), state.policy_version)
    rng = np.random.default_rng([exp.seed, i])
    first = share.index * per_process  # this process's first query of the step
    tasks = share.of([train_tasks[q] for q in queries.step(i)])
    with clock("rollout"):
      batch = rollout(sampler, tokenizer, tasks, local_rollout, judge, rng, first_query=first)
      rollouts, episodes, extra_rounds = batch.rollouts, batch.episodes, 0
      if exp.advantage_filters_groups:  # each process refills its own share
        def resample(k, i=i, rng=rng):
          extra = queries.extra(i, k, exp.train.queries_per_step)
          more = share.of([train_tasks[q] for q in extra])
          return rollout(sampler, tokenizer, more, local_rollout, judge, rng, first_query=first)
        rollouts, episodes, extra_rounds = refill.dapo_refill(
            batch, exp.estimator, exp.advantage, resample, per_process,
            exp.train.dynamic_sampling_tries)
      # The rows' longest length (every process's), not the context bound.
      rollouts = trim_tokens(rollouts, longest=distributed.global_max(longest_row(rollouts)))
      local = rollouts
      rollouts = _global_rollouts(local, share, mesh, rules)
      sampler.sleep()  # the update takes the accelerators until the next hand-over
    with clock("advantages"):
      adv = jax.block_until_ready(exp.estimator(rollouts, exp.advantage))
    with clock("reference"):
      rollouts = jax.block_until_ready(with_reference_logprobs(rollouts, reference, exp.loss))
      if own_logprobs is not None:  # π_old at the step's temperature (train.tempered_policy)
        rollouts = jax.block_until_ready(with_policy_logprobs(rollouts, own_logprobs,
                                                              state.params))
    with clock("update"):  # ppo_epochs passes over the batch's mini-batches (SPEC §5.1)
      state, updates = update_passes(
          state, steps["rl"], policy_batch(rollouts, adv),
          distributed.host_rows(rollouts.group_id), distributed.host_rows(rollouts.row_valid),
          exp.train.num_minibatches, exp.train.ppo_epochs, seed=exp.seed, step=i)
    state = dataclasses.replace(state, policy_version=state.policy_version + 1,
                                data_position={**state.data_position, "rl_step": i + 1})
    local_adv = adv.replace(extras={}, **{f: distributed.local_rows(getattr(adv, f))
                                          for f in ("tokens", "steps", "rows", "row_reward",
                                                    "row_mask")})
    loss_metrics, update_stats = combine_updates(updates)
    stats = rl_metrics(local, local_adv, loss_metrics, episodes, batch.stats,
                       exp.rollout.max_steps, exp.loss.aggregation,
                       first_update=None if own_logprobs is not None else updates[0])
    stats.update(update_stats)
    stats.update(clock.metrics(batch.stats))
    stats["dapo/extra_rounds"] = extra_rounds
    stats = distributed.reduce_stats(stats)  # every process's rows
    every = exp.train.eval_every
    if (every and (i + 1) % every == 0) or i + 1 == exp.train.steps:
      with clock("eval"):
        last_eval = evaluate_and_log(i + 1)
      stats["time/eval_s"] = clock.seconds["eval"]
    if (i + 1) % exp.train.log_every == 0:
      writer.write("rl", i + 1, stats)
    progress.update(i + 1, reward=stats["reward/mean"],
                    accuracy=None if last_eval is None else last_eval["eval/accuracy"])
    if (i + 1) % exp.train.checkpoint_every == 0 or i + 1 == exp.train.steps:
      ckpt.save(state)
  ckpt.wait()
  run_clock.seconds["rl"] = (time.perf_counter() - rl_start -
                             (run_clock.seconds.get("eval", 0.0) - eval_before_rl))

  # -- Final evaluation, export, summary ------------------------------------------------------
  distributed.barrier("rl-done")  # process 0's files of the run are written
  if last_eval is None and exp.train.steps == 0 and exp.sft.steps > 0:
    last_eval = json.load(open(os.path.join(workdir, "eval_after_sft.json")))  # the same weights
  if last_eval is None:  # resumed after the last step, or no RL steps
    last_eval = evaluate_now()
  if exp.train.export_final:
    out = os.path.join(workdir, "hf_export")
    model = nnx.merge(graphdef, weights.sampler_params(state))  # whole on every process
    if distributed.is_primary():
      export_hf(model, out, source_dir=tok_dir, overwrite=True)
  first_path = os.path.join(workdir, "eval_after_sft.json")
  first = json.load(open(first_path)) if os.path.exists(first_path) else {}
  summary = {"after_sft": first, "after_rl": last_eval, "rl_steps": exp.train.steps,
             "policy_version": state.policy_version,
             "seconds": {k: round(v, 1) for k, v in run_clock.seconds.items()}}
  _write_json(os.path.join(workdir, "summary.json"), summary)
  if distributed.is_primary():
    print(summary_table(first, last_eval, stage="SFT" if exp.sft.steps else "start"),
          file=sys.stdout, flush=True)
  distributed.barrier("run-done")
  return summary


if __name__ == "__main__":
  app.run(main)
