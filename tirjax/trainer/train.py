"""A run: supervised warm start, then agentic RL with a registered estimator, then the final
evaluation and export (`experiments.train` is its command line).

Restarting with the same workdir resumes from the last checkpoint (same data order, PRNG
streams and policy version). The workdir receives config.json, status.json, metrics.jsonl,
TensorBoard events, checkpoints/ and hf_export/ (see `tirjax.rundir`).

Several processes (hosts) run the same command with `distributed.*` set (`tirjax.distributed`,
docs/scaling.md): each samples its share of a step's queries, the update runs on the global
batch, and process 0 writes the run directory. The run's parts are built in
`tirjax.trainer.parts`; its stages are `tirjax.trainer.stages`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

from tirjax import distributed, rundir
from tirjax.checkpoint import CheckpointCorrupt, CheckpointOptions, Checkpointer
from tirjax.trainer import parts, prepare, processes, resolve, samplers, stages, staleness
from tirjax.trainer.progress import Progress


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
  mesh, exp = parts.mesh(exp)
  share = processes.StepShare.of(mesh, exp.sharding.rules, exp.rollout,
                                 exp.train.queries_per_step)  # this process's rows of a step
  data = parts.data(exp, cleanup)
  graphdef, params, phases = parts.model(exp, len(data.tokenizer), mesh)
  value_model = parts.critic(exp, graphdef, params, mesh)  # None unless the estimator reads values

  # -- Checkpoint restore, sampler ------------------------------------------------------------
  ckpt = Checkpointer(os.path.join(workdir, rundir.CHECKPOINTS), run_id=run_id,
                      options=CheckpointOptions(max_to_keep=exp.train.keep_checkpoints),
                      on_commit=writer.checkpointed)
  cleanup.callback(ckpt.close)
  _refuse_stale_resume(exp, workdir, ckpt)  # before the restore trims the metrics to the checkpoint
  state = parts.restore(exp, workdir, ckpt, params, phases, writer, resuming, graphdef,
                        value_model)
  del params  # the train state owns the (donated) parameter buffers from here on
  sampler = samplers.make_sampler(exp.sampler, exp.step.logprob_chunk_size, graphdef, state,
                                  workdir, data.tokenizer_dir, share.rollout)
  cleanup.callback(sampler.close)
  trainer = parts.Trainer(exp, workdir, data, graphdef, phases, share, sampler, ckpt, writer,
                          progress, critic=value_model)

  # -- Supervised warm-start (or the first evaluation), RL, final evaluation and export -------
  if state.data_position["phase"] == "sft":
    state = stages.warm_start(trainer, state)
  elif (exp.train.eval_at_start and state.data_position["rl_step"] == 0
        and not processes.exists(os.path.join(workdir, rundir.EVAL_AFTER_SFT))):
    trainer.evaluate_and_log(state, 0, stage="start")
  state, last_eval = stages.rl(trainer, state)
  return stages.final(trainer, state, last_eval)




def _refuse_stale_resume(exp: resolve.Experiment, workdir: str, ckpt: Checkpointer) -> None:
  """A k >= 1 run (`train.max_staleness`) resumes inside its RL phase only with the queue saved
  with its last checkpoint (`staleness.check_resumable`); a corrupt last checkpoint is left to
  the restore to handle."""
  if not exp.train.max_staleness or ckpt.latest_step() is None:
    return
  try:
    position = ckpt.meta()["data_position"]
  except CheckpointCorrupt:
    return
  if position.get("phase") == "rl":
    staleness.check_resumable(workdir, exp.train.max_staleness, ckpt.latest_step(),
                              position["rl_step"], exp.train.steps)
