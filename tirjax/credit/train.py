"""Training one bench cell: sample → registry estimator → PPO-clip policy loss → optax.

Per iteration: the behaviour policy's table samples a batch (`chain_rollouts`), the cell's estimator
(unchanged, from the registry) gives token advantages and the unlearning diagnostic is
taken on its step advantages, then `epochs` full-batch Adam steps minimise
`tirjax.loss.objective` (its `sum / den`). After every update the policy is evaluated
exactly (`evaluate.policy_value`); "episodes to threshold" is the number of training rows
consumed when the sampled policy's success first reaches `threshold` × the optimal success.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from tirjax import advantages, option_checks
from tirjax.advantages import unlearning
from tirjax.credit import chain_rollouts, evaluate
from tirjax.credit.cells import Cell
from tirjax.credit.softmax_policy import (PolicyOptions, init_policy, log_policy, prior_logits,
                                  state_features)
from tirjax.credit.task import ChainTask
from tirjax.loss import LossOptions, policy_loss


@dataclasses.dataclass(frozen=True)
class CreditTrainOptions:
  """Attributes:
    iterations: training batches per run.
    learning_rate: Adam step size.
    epochs: full-batch PPO-clip steps per batch (1: one policy-gradient step).
    entropy_coef: entropy bonus of the loss (spec §5), the same for every cell.
    threshold: fraction of the optimal success that counts as "reached".
    reward_window: final reward = mean batch outcome over this many last iterations.
    curve_every: the returned curve keeps every this-many-th evaluation and the last (the
      threshold is still checked after every update).
    policy: the policy network.
  """

  iterations: int = 200
  learning_rate: float = 0.01
  epochs: int = 2
  entropy_coef: float = 0.0
  threshold: float = 0.9
  reward_window: int = 10
  curve_every: int = 5
  policy: PolicyOptions = PolicyOptions()

  def __post_init__(self):
    for name in ("iterations", "epochs", "reward_window", "curve_every"):
      option_checks.at_least(name, getattr(self, name), 1)
    option_checks.above("learning_rate", self.learning_rate, 0)
    option_checks.lies_in("threshold", self.threshold, 0, 1, open_low=True)


def ppo_objective(params, features, prior, states, batch_tokens, old_logprobs, adv, loss_mask,
                  row_mask, opts: LossOptions):
  """`policy_loss` of the batch under `params`: its aggregated value sum / max(den, 1)."""
  table = log_policy(params, features, prior)
  logprobs = table[states, batch_tokens]
  entropy = -jnp.sum(jnp.exp(table) * table, axis=-1)[states]
  out = policy_loss(logprobs, old_logprobs, adv, loss_mask, row_mask, opts, entropy=entropy)
  return out.loss.sum / jnp.maximum(out.loss.den, 1.0)


@functools.cache
def _update_fn(learning_rate: float, epochs: int, loss: LossOptions):
  optimizer = optax.adam(learning_rate)

  @jax.jit
  def update(params, opt_state, features, prior, states, rollouts, adv):
    def one_epoch(carry, _):
      p, s = carry
      grads = jax.grad(ppo_objective)(p, features, prior, states, rollouts.tokens,
                                      rollouts.old_logprobs, adv.tokens, rollouts.loss_mask,
                                      adv.row_mask, loss)
      updates, s = optimizer.update(grads, s, p)
      return (optax.apply_updates(p, updates), s), None

    (params, opt_state), _ = jax.lax.scan(one_epoch, (params, opt_state), None, length=epochs)
    return params, opt_state

  return optimizer, update


_log_policy = jax.jit(log_policy)


def run_cell(task: ChainTask, cell: Cell, seed: int, opts: CreditTrainOptions = CreditTrainOptions(),
             check_batches: bool = True) -> dict:
  """Trains a fresh policy for one cell and seed; returns its curve and summary metrics.

  Args:
    task: the chain task.
    cell: estimator, options, rollout kind and loss (`cells.parse_cell`).
    seed: seeds the policy initialisation and all sampling.
    opts: training options.
    check_batches: `validate` every batch (host-side, a few ms each).

  Returns:
    dict with `curve` (per evaluation: episodes, success, greedy_success, mean_outcome),
    `final` (metrics of the last policy and the training averages) and `seconds`.
  """
  start = time.perf_counter()
  estimator = advantages.get(cell.estimator)
  est_opts = cell.estimator_options()
  loss = dataclasses.replace(cell.loss, entropy_coef=opts.entropy_coef)
  optimizer, update = _update_fn(opts.learning_rate, opts.epochs, loss)
  features = jnp.asarray(state_features(task))
  prior = jnp.asarray(prior_logits(task, opts.policy))
  params = init_policy(jax.random.PRNGKey(seed), task, opts.policy)
  opt_state = optimizer.init(params)
  rng = np.random.default_rng(seed)
  target = opts.threshold * evaluate.optimal_value(task)["success"]

  curve = {k: [] for k in ("episodes", "success", "greedy_success", "mean_outcome")}
  rewards, rates, row_rates = [], [], []
  num_necessary = num_negative = episodes = samples = 0
  reached = None
  log_probs = np.asarray(_log_policy(params, features, prior))
  for it in range(opts.iterations + 1):
    value = evaluate.policy_value(task, np.exp(log_probs))
    greedy = evaluate.policy_value(task, evaluate.greedy_probs(log_probs))["success"]
    if it % opts.curve_every == 0 or it == opts.iterations:
      for key, v in [("episodes", episodes), ("success", value["success"]),
                     ("greedy_success", greedy), ("mean_outcome", value["mean_outcome"])]:
        curve[key].append(int(v) if key == "episodes" else round(float(v), 6))
    if reached is None and value["success"] >= target:
      reached = episodes
    if it == opts.iterations:
      break
    batch = chain_rollouts.sample_batch(rng, task, log_probs, cell.rollouts, it, check_batches)
    r = batch.rollouts
    adv = estimator(r, est_opts)
    diag = jax.device_get(unlearning.unlearning_rate(r, adv.steps, loss.aggregation, adv.row_mask))
    if diag["num_necessary"] > 0:
      rates.append(float(diag["rate"]))
      row_rates.append(float(diag["row_rate"]))
    num_necessary += int(diag["num_necessary"])
    num_negative += int(diag["num_negative"])
    rewards.append(float(np.mean(np.asarray(r.outcome))))
    params, opt_state = update(params, opt_state, features, prior, batch.states, r, adv)
    log_probs = np.asarray(_log_policy(params, features, prior))
    episodes += r.num_rows
    samples += batch.num_samples

  final = {f"eval/{k}": float(v) for k, v in value.items()}
  final.update({
      "eval/greedy_success": greedy,
      "reached_threshold": float(reached is not None),
      "episodes_to_threshold": reached,
      "reward/mean": float(np.mean(rewards[-opts.reward_window:])),
      "unlearning/rate": float(np.mean(rates)) if rates else None,
      "unlearning/row_rate": float(np.mean(row_rates)) if row_rates else None,
      "unlearning/pooled_rate": num_negative / num_necessary if num_necessary else None,
      "unlearning/num_necessary": num_necessary,
      "unlearning/batches_with_necessary": len(rates),
      "episodes": episodes, "sampled_steps": samples})
  return dict(curve=curve, final=final, seconds=time.perf_counter() - start)
