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
import os
import sys
import time
from typing import Any, Callable, Optional

import jax
import numpy as np
import optax
from absl import app, flags, logging
from flax import nnx
from ml_collections import config_flags

from configs import base
from tirjax import cli, distributed, rundir, sharding
from tirjax.checkpoint import CheckpointOptions, Checkpointer, TrainState
from tirjax.credit.fidelity import episode_labels
from tirjax.env import environments
from tirjax.episodes import judging, rollout
from tirjax.ablation.grid import config_module
from tirjax.models.hf_io import export_hf
from tirjax.rollouts import Rollouts
from tirjax.trainer import prepare, processes, refill, resolve, samplers, weights
from tirjax.trainer import tasks as tasks_lib
from tirjax.trainer.evaluation import evaluate_run
from tirjax.trainer.progress import Progress, summary_table
from tirjax.trainer.rl_metrics import PhaseClock, credit_metrics, rl_metrics
from tirjax.trainer.sft_data import SFTData
from tirjax.trainer.tasks import TaskSource, load_tokenizer
from tirjax.training.batches import SFTBatch, longest_row, policy_batch, trim_tokens
from tirjax.training.minibatches import combine_updates, update_passes
from tirjax.training.optimizer import make_optimizer
from tirjax.training.reference import (ReferencePolicy, TokenLogprobs, with_policy_logprobs,
                                      with_reference_logprobs)
from tirjax.training.policy_step import policy_step
from tirjax.training.step import Placement, init_state, placement, sft_step, split_model

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Experiment config, e.g. configs/portool.py:model=tiny",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Run directory (created, or resumed when it holds this run).")
flags.DEFINE_bool("print_config", False, "Print every config key with its value and where it "
                  "came from (configs/base.py `provenance`), then exit without training.")
flags.mark_flag_as_required("config")

def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # Orbax logs every save at INFO
  if FLAGS.print_config:
    print(config_lines(config_flags.get_config_filename(FLAGS["config"]), FLAGS.config))
    return
  if not FLAGS.workdir:
    raise app.UsageError("--workdir is required (the run directory)")
  run(FLAGS.config, FLAGS.workdir)


def config_lines(config_spec: str, config) -> str:
  """`key = value  # source` per key of `config` (`--print_config`)."""
  config_file, _, arg = config_spec.partition(":")
  get_config = config_module(config_file).get_config
  return "\n".join(f"{key} = {value!r}  # {source}" for key, value, source
                    in base.provenance(get_config, config_file, arg or None, config))


def check(argv) -> resolve.Experiment:
  """What `run` checks before any compute, for the parsed flags: the config's options, its
  shapes fitted to its data (`prepare.experiment`)."""
  del argv
  return prepare.experiment(FLAGS.config)


def run(config, workdir: str) -> dict:
  """The whole run; returns the final summary (also printed and written to summary.json)."""
  # -- Set-up and logging: the raw config's only use is checked options and the run's record --
  distributed.initialize(resolve.distributed_options(config))  # before anything touches JAX
  exp = prepare.experiment(config)  # every value checked, shapes fitted to the data
  record = resolve.config_record(config)  # config.json, the run's id, the loggers' config
  run_id = rundir.run_id(record)
  resuming = processes.claim_workdir(workdir, record)
  primary = distributed.is_primary()  # process 0 writes the run directory
  if primary:
    rundir.write_status(workdir, "running", 0)
    rundir.write_cell(workdir, dict(
        label=exp.estimator.name, estimator=exp.estimator.name,
        options=dataclasses.asdict(exp.advantage), seed=exp.seed), keep=True)
  writer = (rundir.MetricsWriter(workdir, exp.train.loggers, run_id, record) if primary
            else rundir.NullWriter())
  progress = Progress(enabled=exp.train.progress_bar, quiet=not primary)
  try:
    with contextlib.ExitStack() as cleanup:  # sampler, checkpointer, tasks: closed however it ends
      summary = _train(exp, workdir, run_id, writer, progress, resuming, cleanup)
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


def _train(exp: resolve.Experiment, workdir: str, run_id: str, writer, progress: Progress,
           resuming: bool, cleanup: contextlib.ExitStack) -> dict:
  # -- Mesh, data and environment, model and optimizers ---------------------------------------
  mesh, exp = _mesh(exp)
  share = processes.StepShare.of(mesh, exp.sharding.rules, exp.rollout,
                                 exp.train.queries_per_step)  # this process's rows of a step
  data = _data(exp, cleanup)
  graphdef, params, phases = _model(exp, len(data.tokenizer), mesh)

  # -- Checkpoint restore, sampler ------------------------------------------------------------
  ckpt = Checkpointer(os.path.join(workdir, rundir.CHECKPOINTS), run_id=run_id,
                      options=CheckpointOptions(max_to_keep=exp.train.keep_checkpoints),
                      on_commit=writer.checkpointed)
  cleanup.callback(ckpt.close)
  state = _restore(exp, workdir, ckpt, params, phases, writer, resuming)
  del params  # the train state owns the (donated) parameter buffers from here on
  sampler = samplers.make_sampler(exp.sampler, exp.step.logprob_chunk_size, graphdef, state,
                                  workdir, data.tokenizer_dir, share.rollout)
  cleanup.callback(sampler.close)
  trainer = Trainer(exp, workdir, data, graphdef, phases, share, sampler, ckpt, writer,
                    progress)

  # -- Supervised warm-start (or the first evaluation), RL, final evaluation and export -------
  if state.data_position["phase"] == "sft":
    state = _warm_start(trainer, state)
  elif (exp.train.eval_at_start and state.data_position["rl_step"] == 0
        and not processes.exists(os.path.join(workdir, rundir.EVAL_AFTER_SFT))):
    trainer.evaluate_and_log(state, 0, stage="start")
  state, last_eval = _rl(trainer, state)
  return _final(trainer, state, last_eval)


@dataclasses.dataclass(frozen=True)
class Data:
  """The run's tokenizer, tasks (train, eval, SFT demonstrations) and judge."""

  tokenizer_dir: str
  tokenizer: Any
  source: TaskSource
  train_tasks: list
  eval_tasks: list
  demo_tasks: list
  judge: Any
  queries: tasks_lib.QueryOrder  # each RL step's train tasks


@dataclasses.dataclass(frozen=True)
class Phase:
  """A training phase ("sft" or "rl"): its optimizer, its arrays' placement, its jitted step."""

  tx: optax.GradientTransformation
  place: Placement
  step: Callable


@dataclasses.dataclass(frozen=True)
class StepBatch:
  """One RL step's rollouts: the global batch, and this process's rows of it with their
  episodes (its host metrics)."""

  rollouts: Rollouts
  local: Rollouts
  episodes: list
  stats: dict  # the sampler's
  extra_rounds: int  # DAPO's refill rounds
  labels: Optional[list] = None  # per local row, its turns' labels (toolworld: credit/...)


@dataclasses.dataclass(frozen=True)
class Trainer:
  """What every stage of a run works with."""

  exp: resolve.Experiment
  workdir: str
  data: Data
  graphdef: nnx.GraphDef
  phases: dict[str, Phase]
  share: processes.StepShare
  sampler: Any
  ckpt: Checkpointer
  writer: Any
  progress: Progress
  # this process's seconds in SFT, RL and evaluation (summary.json)
  clock: PhaseClock = dataclasses.field(default_factory=PhaseClock)

  def evaluate(self, state: TrainState, subset: bool = False) -> dict:
    """Hands `state`'s weights to the sampler and evaluates them (greedy by default), each
    process its block of the tasks (all get every metric); on toolworld also the policy's
    preference for the directions its questions state. `subset`: only the first
    `train.eval_subset` tasks, every metric named `eval/subset/...` (a curve's point)."""
    exp, data = self.exp, self.data
    n = exp.train.eval_subset
    tasks = data.eval_tasks[:n] if subset else data.eval_tasks
    start, stop = distributed.task_block(len(tasks))
    with self.clock("eval"):
      params = weights.sampler_params(state)
      self.sampler.update(params, state.policy_version)
      result = evaluate_run(exp, self.sampler, data.tokenizer, tasks, data.judge, self.graphdef,
                            params, samples=0 if subset else exp.sampler.eval_samples,
                            subset=0 if subset else n,
                            progress=self.progress.evaluation(stop - start))
      if subset:
        result = {k.replace("eval/", "eval/subset/", 1): v for k, v in result.items()}
      return result

  def evaluate_and_log(self, state: TrainState, step: int, stage: Optional[str] = None,
                       subset: bool = False) -> dict:
    """`evaluate`, written as the metrics' eval row `step`; with `stage` ("sft": after the warm
    start, "start": before RL without one) also the run's first evaluation
    (`rundir.EVAL_AFTER_SFT`)."""
    result = self.evaluate(state, subset)
    if stage is not None:
      processes.write_json(os.path.join(self.workdir, rundir.EVAL_AFTER_SFT), result)
    self.writer.write("eval", step, {**result, "eval/stage": stage} if stage else result)
    return result


def _mesh(exp: resolve.Experiment) -> tuple[jax.sharding.Mesh, resolve.Experiment]:
  """The device mesh, and `exp` with its batch rows fitted to the mesh's batch shards."""
  mesh = sharding.make_mesh(exp.sharding)
  batch_axes = sharding.batch_spec(exp.sharding.rules)[0] or ()
  shards = int(np.prod([mesh.shape[a] for a in (batch_axes if isinstance(batch_axes, tuple)
                                                 else (batch_axes,))]))
  return mesh, resolve.fit_to_mesh(exp, shards, exp.sft.batch_size if exp.sft.steps else None)


def _data(exp: resolve.Experiment, cleanup: contextlib.ExitStack) -> Data:
  tok_dir = tasks_lib.shared_tokenizer_dir(exp.model, exp.env, seed=exp.seed)
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
  return Data(tok_dir, tokenizer, source, train_tasks, eval_tasks, demo_tasks, judge, queries)


def _model(exp: resolve.Experiment, vocab_size: int, mesh) -> tuple[nnx.GraphDef, Any, dict]:
  """The policy's graph and initial parameters, and each phase's optimizer and step."""
  rules = exp.sharding.rules
  graphdef, params = split_model(weights.build_model(exp.model, vocab_size, rules,
                                                     seed=exp.seed))
  sft_tx, rl_tx = make_optimizer(exp.sft.optim), make_optimizer(exp.optim)
  sft_place = placement(params, sft_tx, mesh, rules)
  rl_place = placement(params, rl_tx, mesh, rules)
  return graphdef, params, {
      "sft": Phase(sft_tx, sft_place, sft_step(graphdef, sft_tx, sft_place, exp.sft.loss,
                                               exp.sft.step)),
      "rl": Phase(rl_tx, rl_place, policy_step(graphdef, rl_tx, rl_place, exp.loss, exp.step))}


def _restore(exp: resolve.Experiment, workdir: str, ckpt: Checkpointer, params,
             phases: dict[str, Phase], writer, resuming: bool) -> TrainState:
  """The newest intact checkpoint's state (corrupt ones are named), or a fresh one that starts
  with SFT when there is SFT."""
  def fresh(phase: str, **kwargs) -> TrainState:
    return init_state(params, phases[phase].tx, phases[phase].place, jax.random.key(exp.seed),
                      **kwargs)
  phase = "sft" if exp.sft.steps > 0 else "rl"
  state = fresh(phase, data_position={"phase": phase, "sft_step": 0, "rl_step": 0})
  if ckpt.latest_step() is not None:
    # the saved phase decides the optimizer state's structure
    state = ckpt.restore(lambda meta: fresh(meta["data_position"]["phase"]))
    phase = state.data_position["phase"]
    writer.truncate_after(rundir.phase_steps(state.data_position))
    if distributed.is_primary():
      print(f"resumed {workdir} at {phase} step "
            f"{state.data_position[phase + '_step']} (policy version {state.policy_version})")
  elif resuming:
    writer.truncate_after({"sft": 0, "rl": 0, "eval": -1})
  return state


def _warm_start(trainer: Trainer, state: TrainState) -> TrainState:
  """SFT on demonstrations up to `sft.steps`, its evaluation, then the state RL starts from:
  the same weights with a fresh optimizer (one checkpoint marks it)."""
  exp, sft, data = trainer.exp, trainer.phases["sft"], trainer.data
  demos = SFTData.from_sequences(
      data.source.demonstrations(data.demo_tasks, data.tokenizer, exp.sft.demos,
                                 exp.sft.num_demos),
      exp.rollout.shapes.max_tokens, seed=exp.seed)
  trainer.progress.start("sft", exp.sft.steps, state.data_position["sft_step"])
  start = time.perf_counter()
  while state.data_position["sft_step"] < exp.sft.steps:
    i = state.data_position["sft_step"]
    state, metrics = sft.step(state, SFTBatch(**demos.batch(i, exp.sft.batch_size)))
    state = dataclasses.replace(state, data_position={**state.data_position, "sft_step": i + 1})
    rec = trainer.writer.write("sft", i + 1, jax.device_get(metrics))
    trainer.progress.update(i + 1, loss=rec["loss"])
    if (i + 1) % exp.train.checkpoint_every == 0 and i + 1 < exp.sft.steps:
      trainer.ckpt.save(state)
  trainer.clock.seconds["sft"] = time.perf_counter() - start
  trainer.evaluate_and_log(state, 0, stage="sft")
  rl = trainer.phases["rl"]
  state = init_state(state.params, rl.tx, rl.place, state.rng, step=state.step,
                     data_position={**state.data_position, "phase": "rl"},
                     policy_version=state.policy_version)
  trainer.ckpt.save(state)
  return state


def _rl(trainer: Trainer, state: TrainState) -> tuple[TrainState, Optional[dict]]:
  """RL steps up to `train.steps`; returns the state and the last evaluation (None if none
  ran). Each process samples its share of a step; the rest works on the global batch."""
  exp, rl, sampler, graphdef = trainer.exp, trainer.phases["rl"], trainer.sampler, trainer.graphdef
  reference = None
  if exp.loss.kl_coef > 0:  # the KL reference: the policy as RL starts (kept across restarts)
    params = weights.reference_params(state, trainer.workdir, trainer.ckpt.run_id)
    reference = ReferencePolicy(graphdef, params, rl.place, exp.step)
  own_logprobs = TokenLogprobs(graphdef, rl.place, exp.step) if exp.train.tempered_policy else None
  trainer.progress.start("rl", exp.train.steps, state.data_position["rl_step"])
  last_eval = None
  start, eval_before = time.perf_counter(), trainer.clock.seconds.get("eval", 0.0)
  while state.data_position["rl_step"] < exp.train.steps:
    i = state.data_position["rl_step"]
    clock = PhaseClock()  # every phase waited on before its clock stops (asynchronous dispatch)
    with clock("handover"):
      sampler.update(weights.sampler_params(state), state.policy_version)
    with clock("rollout"):
      batch = _sample(trainer, i)
      sampler.sleep()  # the update takes the accelerators until the next hand-over
    with clock("advantages"):
      adv = jax.block_until_ready(exp.estimator(batch.rollouts, exp.advantage))
    with clock("reference"):
      rollouts = _with_reference_and_old_logprobs(batch.rollouts, reference, own_logprobs,
                                                  state, exp.loss)
    with clock("update"):  # ppo_epochs passes over the batch's mini-batches (SPEC §5.1)
      state, updates = update_passes(
          state, rl.step, policy_batch(rollouts, adv),
          distributed.host_rows(rollouts.group_id), distributed.host_rows(rollouts.row_valid),
          exp.train.num_minibatches, exp.train.ppo_epochs, seed=exp.seed, step=i)
    state = dataclasses.replace(state, policy_version=state.policy_version + 1,
                                data_position={**state.data_position, "rl_step": i + 1})
    stats = _step_metrics(exp, batch, adv, updates, clock, old_recomputed=own_logprobs is not None)
    done, last = i + 1, i + 1 == exp.train.steps
    if (exp.train.eval_every and done % exp.train.eval_every == 0) or last:
      subset = exp.train.eval_subset > 0 and not last  # the last is the run's result
      with clock("eval"):
        result = trainer.evaluate_and_log(state, done, subset=subset)
      last_eval = last_eval if subset else result
      stats["time/eval_s"] = clock.seconds["eval"]
    if done % exp.train.log_every == 0:
      trainer.writer.write("rl", done, stats)
    trainer.progress.update(done, reward=stats["reward/mean"],
                            accuracy=None if last_eval is None else last_eval["eval/accuracy"])
    if done % exp.train.checkpoint_every == 0 or last:
      trainer.ckpt.save(state)
  trainer.ckpt.wait()
  trainer.clock.seconds["rl"] = (time.perf_counter() - start
                                 - (trainer.clock.seconds.get("eval", 0.0) - eval_before))
  return state, last_eval


def _sample(trainer: Trainer, i: int) -> StepBatch:
  """RL step `i`'s rollouts: this process's share of the step's queries sampled, executed and
  judged (groups refilled by DAPO's dynamic sampling), then the step's global batch."""
  exp, data, share = trainer.exp, trainer.data, trainer.share
  rng = np.random.default_rng([exp.seed, i])
  sampled = {}  # task_id -> task, to label the turns of its rows

  def sample(queries):
    tasks = share.tasks([data.train_tasks[q] for q in queries])
    sampled.update((t.task_id, t) for t in tasks)
    return rollout(trainer.sampler, data.tokenizer, tasks, share.rollout, data.judge, rng,
                   first_query=share.first_query)
  batch = sample(data.queries.step(i))
  rollouts, episodes, extra_rounds = batch.rollouts, batch.episodes, 0
  if exp.advantage_filters_groups:  # each process refills its own share
    rollouts, episodes, extra_rounds = refill.dapo_refill(
        batch, exp.estimator, exp.advantage,
        lambda k: sample(data.queries.extra(i, k, exp.train.queries_per_step)), share.queries,
        exp.train.dynamic_sampling_tries)
  # The rows' longest length (every process's), not the context bound.
  local = trim_tokens(rollouts, longest=distributed.global_max(longest_row(rollouts)))
  label = environments.get(exp.env.name).turn_labels  # turns labelled from the task's plan
  labels = episode_labels(episodes, sampled.get, local.num_rows, label) if label else None
  return StepBatch(share.global_rollouts(local), local, episodes, batch.stats, extra_rounds,
                   labels)


def _with_reference_and_old_logprobs(rollouts: Rollouts, reference, own_logprobs, state,
                                     loss_options) -> Rollouts:
  """The KL reference's log-probs (when there is a KL term) and, on the tempered policy, π_old
  recomputed at the step's temperature (`train.tempered_policy`)."""
  rollouts = jax.block_until_ready(with_reference_logprobs(rollouts, reference, loss_options))
  if own_logprobs is not None:
    rollouts = jax.block_until_ready(with_policy_logprobs(rollouts, own_logprobs, state.params))
  return rollouts


def _step_metrics(exp: resolve.Experiment, batch: StepBatch, adv, updates: list,
                  clock: PhaseClock, old_recomputed: bool) -> dict:
  """The step's metrics: each process's of its own rows, combined over the processes. The
  first update's ratio is the sampler-vs-trainer gap unless π_old was recomputed."""
  loss_metrics, update_stats = combine_updates(updates)
  stats = rl_metrics(batch.local, processes.StepShare.local_advantages(adv), loss_metrics,
                     batch.episodes, batch.stats, exp.rollout.max_steps, exp.loss.aggregation,
                     first_update=None if old_recomputed else updates[0])
  stats.update(update_stats)
  stats.update(clock.metrics(batch.stats))
  stats["dapo/extra_rounds"] = batch.extra_rounds
  stats = distributed.reduce_stats(stats)  # every process's rows
  if batch.labels is not None:  # already over every process's turns
    stats.update(credit_metrics(batch.local, processes.StepShare.local_advantages(adv),
                                batch.labels))
  return stats


def _final(trainer: Trainer, state: TrainState, last_eval: Optional[dict]) -> dict:
  """The final evaluation (unless the last RL step ran one), the HF export, the summary."""
  exp, workdir = trainer.exp, trainer.workdir
  distributed.barrier("rl-done")  # process 0's files of the run are written
  after_sft_path = os.path.join(workdir, rundir.EVAL_AFTER_SFT)
  if last_eval is None and exp.train.steps == 0 and exp.sft.steps > 0:
    last_eval = rundir.read_json(after_sft_path)  # the same weights
  if last_eval is None:  # resumed after the last step, or no RL steps
    last_eval = trainer.evaluate(state)
  if exp.train.export_final:
    model = nnx.merge(trainer.graphdef, weights.sampler_params(state))  # whole on every process
    if distributed.is_primary():
      export_hf(model, os.path.join(workdir, rundir.HF_EXPORT),
                source_dir=trainer.data.tokenizer_dir, overwrite=True)
  after_sft = rundir.read_json(after_sft_path) if os.path.exists(after_sft_path) else {}
  summary = {"after_sft": after_sft, "after_rl": last_eval, "rl_steps": exp.train.steps,
             "policy_version": state.policy_version,
             "seconds": {k: round(v, 1) for k, v in trainer.clock.seconds.items()}}
  processes.write_json(os.path.join(workdir, rundir.SUMMARY), summary)
  if distributed.is_primary():
    print(summary_table(after_sft, last_eval, stage="SFT" if exp.sft.steps else "start"),
          file=sys.stdout, flush=True)
  distributed.barrier("run-done")
  return summary


if __name__ == "__main__":
  cli.run(main)
