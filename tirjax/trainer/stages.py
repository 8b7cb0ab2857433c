"""The stages of a run, in order: the supervised warm start, the RL loop (sample, advantages,
reference and old log-probs, update, evaluate, checkpoint), and the final evaluation, export
and summary."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Optional

import jax
import numpy as np
from flax import nnx

from tirjax import distributed, rundir
from tirjax.checkpoint import TrainState
from tirjax.metrics.credit import episode_labels, with_turn_labels
from tirjax.env import environments
from tirjax.episodes import rollout
from tirjax.models.hf_io import export_hf
from tirjax.rollouts import Rollouts
from tirjax.trainer import layouts, parts, processes, refill, resolve, staleness, weights
from tirjax.trainer.parts import Trainer
from tirjax.trainer.progress import summary_table
from tirjax.trainer.rl_metrics import (PhaseClock, credit_metrics, rl_metrics,
                                       rollout_correction_metrics)
from tirjax.trainer.sft_data import SFTData
from tirjax.train_steps.answer_probe import AnswerProbe, answer_ids
from tirjax.train_steps.batches import SFTBatch, longest_row, policy_batch, trim_tokens
from tirjax.train_steps.critic import critic_batch, explained_variance
from tirjax.train_steps.minibatches import combine_updates, update_passes
from tirjax.train_steps.reference import (ReferencePolicy, TokenLogprobs, with_policy_logprobs,
                                      with_reference_logprobs)
from tirjax.train_steps.step import init_state


def every(done: int, period: int) -> bool:
  """Whether the step that makes `done` steps falls on `period` (`train.eval_every`,
  `log_every`, `checkpoint_every`; 0: never)."""
  return period > 0 and done % period == 0


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
  answers: Optional[list] = None  # per local row, its task's gold answer (IGPO's probes)


def warm_start(trainer: Trainer, state: TrainState) -> TrainState:
  """SFT on demonstrations up to `sft.steps`, its evaluation, then the state RL starts from:
  the same weights with a fresh optimizer (one checkpoint marks it)."""
  exp, sft, data = trainer.exp, trainer.phases["sft"], trainer.data
  demos = SFTData.from_sequences(
      data.source.demonstrations(data.demo_tasks, data.tokenizer, exp.sft.demos,
                                 exp.sft.num_demos),
      exp.rollout.shapes.max_tokens, seed=exp.seed)
  packers = {"sft": sft.step}  # their sizes so far are checkpointed (`layouts`)
  layouts.resume(state, packers)
  trainer.progress.start("sft", exp.sft.steps, state.data_position["sft_step"])
  start = time.perf_counter()
  while state.data_position["sft_step"] < exp.sft.steps:
    i = state.data_position["sft_step"]
    state, metrics = sft.step(state, SFTBatch(**demos.batch(i, exp.sft.batch_size)))
    state = dataclasses.replace(state, data_position={**state.data_position, "sft_step": i + 1})
    rec = trainer.writer.write("sft", i + 1, jax.device_get(metrics))
    trainer.progress.update(i + 1, loss=rec["loss"])
    if every(i + 1, exp.train.checkpoint_every) and i + 1 < exp.sft.steps:
      trainer.ckpt.save(layouts.recorded(state, packers))
  trainer.clock.seconds["sft"] = time.perf_counter() - start
  trainer.evaluate_and_log(state, 0, stage="sft")
  rl = trainer.phases["rl"]
  state = init_state(state.params, rl.tx, rl.place, state.rng, step=state.step,
                     data_position={**layouts.cleared(state.data_position), "phase": "rl"},
                     policy_version=state.policy_version)
  # the critic (ppo, turn_ppo) starts from the warm-started policy with a zero head
  state = parts.with_critic(state, trainer.graphdef, trainer.critic)
  trainer.ckpt.save(state)
  return state


def rl(trainer: Trainer, state: TrainState) -> tuple[TrainState, Optional[dict]]:
  """RL steps up to `train.steps`; returns the state and the last evaluation (None if none
  ran). Each process samples its share of a step; the rest works on the global batch."""
  exp, rl, sampler, graphdef = trainer.exp, trainer.phases["rl"], trainer.sampler, trainer.graphdef
  reference = None
  if exp.loss.kl_coef > 0:  # the KL reference: the policy as RL starts (kept across restarts)
    params = weights.reference_params(state, trainer.workdir, trainer.ckpt)
    reference = ReferencePolicy(graphdef, params, rl.place, exp.step)
  # π_old the trainer's own: on the tempered policy, or for a rollout correction (TIS / MIS),
  # which weighs the loss by π_old / π_sampler
  correcting = exp.loss.rollout_correction.enabled
  own_logprobs = (TokenLogprobs(graphdef, rl.place, exp.step)
                  if exp.train.tempered_policy or correcting else None)
  probe = (AnswerProbe(graphdef, rl.place, exp.step)  # IGPO's answer probes (spec §4.4)
           if "answer_logprob" in exp.estimator.needs else None)
  packers = {"rl": rl.step, "reference": reference, "old_logprobs": own_logprobs,
             "answer_probe": probe, "values": trainer.critic,
             "critic_update": None if trainer.critic is None else trainer.critic.step}
  layouts.resume(state, packers)
  # k-step off-policy rollouts (`staleness`): step t trains on a queued batch that θ_{t−k}
  # sampled, while a background thread samples step t + k with θ_t; k = 0 samples step t
  # with θ_t here, as it always did
  k = exp.train.max_staleness
  queue = staleness.SampleQueue(k, ahead=True) if k else None
  if queue is not None and 0 < state.data_position["rl_step"] < exp.train.steps:
    queue.batches = staleness.load_queue(trainer.workdir, state.step, k)  # saved with it
  try:
    return _rl_steps(trainer, state, queue, reference, own_logprobs, probe, packers)
  finally:
    if queue is not None:
      queue.close()


def _rl_steps(trainer: Trainer, state: TrainState, queue, reference, own_logprobs, probe,
              packers: dict) -> tuple[TrainState, Optional[dict]]:
  """`rl`'s loop, from the state's RL step to `train.steps`."""
  exp, rl, sampler = trainer.exp, trainer.phases["rl"], trainer.sampler
  correcting = exp.loss.rollout_correction.enabled
  trainer.progress.start("rl", exp.train.steps, state.data_position["rl_step"])
  last_eval = None
  start, eval_before = time.perf_counter(), trainer.clock.seconds.get("eval", 0.0)
  cpu_start, eval_cpu_before = time.process_time(), trainer.clock.cpu_seconds.get("eval", 0.0)
  while state.data_position["rl_step"] < exp.train.steps:
    i = state.data_position["rl_step"]
    clock = PhaseClock()  # every phase waited on before its clock stops (asynchronous dispatch)
    with clock("handover"):
      sampler.update(weights.sampler_params(state), state.policy_version)
    with clock("rollout"):
      if queue is None:
        batch = sample(trainer, i)
        sampler.sleep()  # the update takes the accelerators until the next hand-over
      else:  # steps sampled ahead sleep the sampler themselves, in the thread that samples
        batch = queue.take(i, exp.train.steps, lambda j: _sample_and_sleep(trainer, j))
    if trainer.critic is not None:  # V of every prefix, before the estimator reads it
      with clock("values"):
        batch = dataclasses.replace(batch, rollouts=batch.rollouts.replace(
            values=trainer.critic.values(state.critic_params, batch.rollouts)))
    with clock("advantages"):
      if probe is not None:
        batch = with_answer_probes(trainer, batch, probe, state.params)
      adv = jax.block_until_ready(exp.estimator(batch.rollouts, exp.advantage))
    critic_stats = {}
    if trainer.critic is not None:  # the critic's update on the estimator's targets
      with clock("critic"):
        state, critic_stats = _critic_update(trainer, state, batch.rollouts, adv, i)
    with clock("reference"):
      rollouts, sampler_logprobs = loss_inputs(batch.rollouts, reference, own_logprobs, state,
                                               exp.loss)
      correction = (rollout_correction_metrics(rollouts, sampler_logprobs, adv.row_mask,
                                               exp.loss.rollout_correction)
                    if correcting else {})
    updates = []  # none in the critic's warm-up (`critic.critic_warmup`): the policy waits
    if trainer.critic is None or i >= exp.critic.critic_warmup:
      with clock("update"):  # ppo_epochs passes over the batch's mini-batches (spec §5.1)
        state, updates = update_passes(
            state, rl.step, policy_batch(rollouts, adv, sampler_logprobs),
            distributed.host_rows(rollouts.group_id), distributed.host_rows(rollouts.row_valid),
            exp.train.num_minibatches, exp.train.ppo_epochs, seed=exp.seed, step=i)
    if queue is not None:  # the rows of step i + k are in: the sampler is free for the
      queue.settle()  # evaluation and the next hand-over, the queue's file complete
    # A warm-up step changes the state (its critic) but not the policy: its step (the
    # checkpoint's number) still grows, its policy version does not.
    state = dataclasses.replace(state, step=state.step + (not updates),
                                policy_version=state.policy_version + bool(updates),
                                data_position={**state.data_position, "rl_step": i + 1})
    stats = _step_metrics(exp, batch, adv, updates, clock, old_recomputed=own_logprobs is not None,
                          trained_version=state.policy_version - bool(updates))
    stats.update(correction)  # already the whole batch's (every process's rows)
    stats.update(critic_stats)
    if queue is not None:
      stats.update(queue.seconds())
    done, last = i + 1, i + 1 == exp.train.steps
    if every(done, exp.train.eval_every) or last:
      subset = exp.train.eval_subset > 0 and not last  # the last is the run's result
      with clock("eval"):
        result = trainer.evaluate_and_log(state, done, subset=subset)
      last_eval = last_eval if subset else result
      stats["time/eval_s"] = clock.seconds["eval"]
    if every(done, exp.train.log_every):
      trainer.writer.write("rl", done, stats)
    trainer.progress.update(done, reward=stats["reward/mean"],
                            accuracy=None if last_eval is None else last_eval["eval/accuracy"])
    if every(done, exp.train.checkpoint_every) or last:
      if queue is not None:  # written before its checkpoint can be committed
        staleness.save_queue(trainer.workdir, state.step, queue.batches)
        staleness.prune_queues(trainer.workdir, trainer.ckpt.steps(), below=state.step)
      trainer.ckpt.save(layouts.recorded(state, packers))
  trainer.ckpt.wait()
  trainer.clock.seconds["rl"] = (time.perf_counter() - start
                                 - (trainer.clock.seconds.get("eval", 0.0) - eval_before))
  trainer.clock.cpu_seconds["rl"] = (
      time.process_time() - cpu_start
      - (trainer.clock.cpu_seconds.get("eval", 0.0) - eval_cpu_before))
  return state, last_eval


def _sample_and_sleep(trainer: Trainer, i: int) -> StepBatch:
  """`sample`, then the sampler's cache dropped (`sampler.sleep`) as the loop drops it after
  sampling a step itself."""
  batch = sample(trainer, i)
  trainer.sampler.sleep()
  return batch


def sample(trainer: Trainer, i: int) -> StepBatch:
  """RL step `i`'s rollouts: this process's share of the step's queries sampled, executed and
  judged (groups refilled by DAPO's dynamic sampling), then the step's global batch."""
  exp, data, share = trainer.exp, trainer.data, trainer.share
  rng = np.random.default_rng([exp.seed, i])
  sampled = {}  # task_id -> task, to label the turns of its rows

  def sample_queries(queries):
    tasks = share.tasks([data.train_tasks[q] for q in queries])
    sampled.update((t.task_id, t) for t in tasks)
    return rollout(trainer.sampler, data.tokenizer, tasks, share.rollout, data.judge, rng,
                   first_query=share.first_query)
  batch = sample_queries(data.queries.step(i))
  rollouts, episodes, extra_rounds = batch.rollouts, batch.episodes, 0
  if exp.advantage_filters_groups:  # each process refills its own share
    rollouts, episodes, extra_rounds = refill.dapo_refill(
        batch, exp.estimator, exp.advantage,
        lambda k: sample_queries(data.queries.extra(i, k, exp.train.queries_per_step)),
        share.queries, exp.train.dynamic_sampling_tries)
  # The padded path computes every position: cut after the rows' longest length (every
  # process's), not the context bound. The packed passes compute no padding, so the batch
  # keeps one width and the estimator and the passes' row layout compile once, not per width.
  local = rollouts if exp.step.packed else trim_tokens(
      rollouts, longest=distributed.global_max(longest_row(rollouts)))
  labels = (episode_labels(episodes, sampled.get, local.num_rows, exp.env.name)  # from the
            if environments.get(exp.env.name).turn_labels else None)  # task's plan, if it has one
  if labels is not None and "turn_label" in exp.estimator.needs:  # `oracle` (spec §4.4);
    local = with_turn_labels(local, labels)  # other runs never depend on the field
  answers = None
  if "answer_logprob" in exp.estimator.needs:  # `igpo`: probed once the params are at hand
    answers = [None] * local.num_rows
    for rec in episodes:
      answers[rec.row] = sampled[rec.task_id].answer
  return StepBatch(share.global_rollouts(local), local, episodes, batch.stats, extra_rounds,
                   labels, answers)


def with_answer_probes(trainer: Trainer, batch: StepBatch, probe, params) -> StepBatch:
  """`batch` with IGPO's `answer_logprob` of its rows under `params` (the parameters it was
  sampled with), by one packed pass over every row's probes (`train_steps.answer_probe`)."""
  prefix, gold = answer_ids(trainer.data.tokenizer, batch.answers,
                            trainer.exp.rollout.answer_protocol)
  local = batch.local.replace(answer_logprob=probe(params, batch.local, prefix, gold))
  return dataclasses.replace(batch, local=local,
                             rollouts=trainer.share.global_rollouts(local))


def loss_inputs(sampled: Rollouts, reference, own_logprobs, state, loss_options
                ) -> tuple[Rollouts, Optional[jax.Array]]:
  """The rollouts the loss reads (`_with_reference_and_old_logprobs`: π_old recomputed with
  `state`'s weights when `own_logprobs` is given) and, with a rollout correction on, the
  behaviour log-probs: each row's as its sampler reported them (at k >= 1 the version that
  sampled the row, `staleness`), else None."""
  rollouts = _with_reference_and_old_logprobs(sampled, reference, own_logprobs, state,
                                              loss_options)
  correcting = loss_options.rollout_correction.enabled
  return rollouts, sampled.old_logprobs if correcting else None  # as sampled


def _with_reference_and_old_logprobs(rollouts: Rollouts, reference, own_logprobs, state,
                                     loss_options) -> Rollouts:
  """The KL reference's log-probs (when there is a KL term) and, on the tempered policy, π_old
  recomputed at the step's temperature (`train.tempered_policy`)."""
  rollouts = jax.block_until_ready(with_reference_logprobs(rollouts, reference, loss_options))
  if own_logprobs is not None:
    rollouts = jax.block_until_ready(with_policy_logprobs(rollouts, own_logprobs, state.params))
  return rollouts


def _critic_update(trainer: Trainer, state: TrainState, rollouts: Rollouts, adv, i: int
                   ) -> tuple[TrainState, dict]:
  """The critic's update passes on the estimator's targets (the policy's mini-batches and
  epochs), and its metrics: `critic/loss`, `critic/clipfrac`, `critic/error` (mean (v − G)²)
  over the updates, `critic/explained_variance` of the values the advantages read, and
  `critic/grad_norm`."""
  exp = trainer.exp
  cbatch = critic_batch(rollouts, adv)
  state, updates = trainer.critic.update(
      state, cbatch, distributed.host_rows(rollouts.group_id),
      distributed.host_rows(rollouts.row_valid), exp.train.num_minibatches,
      exp.train.ppo_epochs, seed=exp.seed, step=i)
  means, _ = combine_updates(updates)
  stats = {f"critic/{k}": means[k] for k in ("loss", "clipfrac", "error", "grad_norm")}
  stats["critic/explained_variance"] = explained_variance(
      distributed.host_rows(cbatch.old_values), distributed.host_rows(cbatch.returns),
      distributed.host_rows(cbatch.value_mask))
  return state, stats


def _step_metrics(exp: resolve.Experiment, batch: StepBatch, adv, updates: list,
                  clock: PhaseClock, old_recomputed: bool, trained_version: int) -> dict:
  """The step's metrics: each process's of its own rows, combined over the processes. The
  first update's ratio is the sampler-vs-trainer gap unless π_old was recomputed; the rows'
  staleness is counted from `trained_version`, the policy's before the step's update."""
  # no policy update in the critic's warm-up: no loss metrics, 0 updates
  loss_metrics, update_stats = (combine_updates(updates) if updates
                                else ({}, {"updates/count": 0.0}))
  stats = rl_metrics(batch.local, processes.StepShare.local_advantages(adv), loss_metrics,
                     batch.episodes, batch.stats, exp.rollout.max_steps, exp.loss.aggregation,
                     first_update=None if old_recomputed or not updates else updates[0])
  stats.update(update_stats)
  stats.update(clock.metrics(batch.stats))
  stats["dapo/extra_rounds"] = batch.extra_rounds
  stats.update(staleness.staleness_metrics(trained_version, batch.local))
  stats = distributed.reduce_stats(stats)  # every process's rows
  if batch.labels is not None:  # already over every process's turns
    stats.update(credit_metrics(batch.local, processes.StepShare.local_advantages(adv),
                                batch.labels))
  return stats


def final(trainer: Trainer, state: TrainState, last_eval: Optional[dict]) -> dict:
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
             "seconds": {k: round(v, 1) for k, v in trainer.clock.seconds.items()},
             "cpu_seconds": {k: round(v, 1) for k, v in trainer.clock.cpu_seconds.items()}}
  processes.write_json(os.path.join(workdir, rundir.SUMMARY), summary)
  if distributed.is_primary():
    print(summary_table(after_sft, last_eval, stage="SFT" if exp.sft.steps else "start"),
          file=sys.stdout, flush=True)
  distributed.barrier("run-done")
  return summary
