"""What every stage of a run works with (`Trainer`), and how a run builds it: the mesh, the
data (tokenizer, tasks, judge, query order), the model with each phase's optimizer and step,
and the state restored from the newest intact checkpoint."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any, Callable, Optional

import jax
import numpy as np
import optax
from flax import nnx

from tirjax import distributed, rundir, sharding
from tirjax.checkpoint import Checkpointer, TrainState
from tirjax.episodes import judging
from tirjax.trainer import processes, resolve, weights
from tirjax.trainer import tasks as tasks_lib
from tirjax.trainer.evaluation import evaluate_run
from tirjax.trainer.progress import Progress
from tirjax.trainer.rl_metrics import PhaseClock
from tirjax.trainer.tasks import TaskSource, load_tokenizer
from tirjax.train_steps.critic import Critic
from tirjax.train_steps.optimizer import make_optimizer
from tirjax.train_steps.steps import policy_step, sft_step
from tirjax.train_steps.step import Placement, init_state, placement, split_model


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
  critic: Optional[Critic] = None  # the value model's passes, for an estimator that reads values

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


def mesh(exp: resolve.Experiment) -> tuple[jax.sharding.Mesh, resolve.Experiment]:
  """The device mesh, and `exp` with its batch rows fitted to the mesh's batch shards."""
  mesh = sharding.make_mesh(exp.sharding)
  batch_axes = sharding.batch_spec(exp.sharding.rules)[0] or ()
  shards = int(np.prod([mesh.shape[a] for a in (batch_axes if isinstance(batch_axes, tuple)
                                                 else (batch_axes,))]))
  return mesh, resolve.fit_to_mesh(exp, shards, exp.sft.batch_size if exp.sft.steps else None)


def data(exp: resolve.Experiment, cleanup: contextlib.ExitStack) -> Data:
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


def model(exp: resolve.Experiment, vocab_size: int, mesh) -> tuple[nnx.GraphDef, Any, dict]:
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


def critic(exp: resolve.Experiment, graphdef: nnx.GraphDef, params, mesh) -> Optional[Critic]:
  """The value model's passes when the estimator reads values (`exp.has_critic`), else None."""
  if not exp.has_critic:
    return None
  return Critic.build(graphdef, params, mesh, exp.sharding.rules, exp.critic,
                      exp.loss.norm_constant, exp.step)


def with_critic(state: TrainState, graphdef: nnx.GraphDef, value_model: Optional[Critic]
                ) -> TrainState:
  """`state` with a critic initialised from its policy (`Critic.init`), as RL starts; the
  state itself without one."""
  if value_model is None:
    return state
  critic_params, critic_opt_state = value_model.init(graphdef, state.params)
  return dataclasses.replace(state, critic_params=critic_params,
                            critic_opt_state=critic_opt_state)


def restore(exp: resolve.Experiment, workdir: str, ckpt: Checkpointer, params,
             phases: dict[str, Phase], writer, resuming: bool,
             graphdef: Optional[nnx.GraphDef] = None, value_model: Optional[Critic] = None
             ) -> TrainState:
  """The newest intact checkpoint's state (corrupt ones are named), or a fresh one that starts
  with SFT when there is SFT. With a critic (`value_model`), an RL state carries it."""
  def fresh(phase: str, **kwargs) -> TrainState:
    state = init_state(params, phases[phase].tx, phases[phase].place, jax.random.key(exp.seed),
                       **kwargs)
    return with_critic(state, graphdef, value_model) if phase == "rl" else state
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


