"""The expected first-order push of each cell on the credit bench's start state.

    python -m experiments.studies.credit_push --json=benchmarks/results/credit_push.json

For each cell label (as `experiments.studies.credit_bench` names them) samples `--batches` batches from
one fixed policy (the bench's warm start, seed 0; `--early` then raises the probability of
answering at progress 0 to that value, the drifted policy that collapsing runs pass through)
and averages `tirjax.credit.push.logit_push` at the start state (progress 0, step 0) for the
answer (the early answer) and for the first chain tool. Also the share of the batch's rows
that answer early and the share of the loss weight (the aggregation's per-token weights ×
|advantage|) those rows carry. Mean ± 95% CI over batches. A cell whose expected push on the
early answer is positive, at a policy that answers early often, drifts towards the local
optimum; comparing tree with independent rollouts under one loss separates the sampler's
share of that push from the loss aggregation's.
"""

from __future__ import annotations

import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from tirjax import advantages, cli
from tirjax.credit import cells, chain_rollouts
from tirjax.credit.cells import split_labels
from tirjax.credit.softmax_policy import PolicyOptions, init_policy, log_policy, prior_logits, state_features
from tirjax.credit.push import logit_push
from tirjax.credit.task import ANSWER, ChainTask
from tirjax.loss import LossOptions, aggregation
from tirjax.reporting import benchmark

DEFAULT_CELLS = ("portool,portool/loss.aggregation=token_mean,portool/rollouts=independent,"
                 "grpo,grpo/loss.aggregation=token_mean,grpo/rollouts=independent")


def _with_early_answer(log_probs: np.ndarray, task: ChainTask, p_early: float) -> np.ndarray:
  """The policy with π(answer | progress 0, any step) set to `p_early`, the rest rescaled."""
  probs = np.exp(log_probs)
  rows = np.arange(task.max_steps)  # progress 0: states 0..T_max-1
  rest = 1.0 - probs[rows, ANSWER]
  probs[rows] *= ((1.0 - p_early) / rest)[:, None]
  probs[rows, ANSWER] = p_early
  return np.log(probs)


def _row_weights(r, loss: LossOptions) -> np.ndarray:
  """[B, L] the aggregation's weight of each loss token (the loss is Σ w · ratio-term), from
  its mode's record: 1/n_b within a row where it averages there, 1/C where it divides by a
  constant, over the batch's tokens or its B rows."""
  rule = aggregation.lookup(loss.aggregation)
  mask = np.asarray(r.loss_mask, np.float64)
  lengths = np.maximum(mask.sum(1, keepdims=True), 1.0)
  weights = mask / lengths if rule.mean_within_row else mask
  if rule.needs_norm_constant:
    weights = weights / loss.norm_constant
  return weights / (max(mask.sum(), 1.0) if rule.den == "tokens" else mask.shape[0])


def measure(label: str, task: ChainTask, log_probs: np.ndarray, batches: int, seed: int) -> dict:
  cell = cells.parse_cell(label, chain_rollouts.ChainRolloutOptions(), task.max_steps)
  estimator, est_opts = advantages.get(cell.estimator), cell.estimator_options()
  push_fn = jax.jit(logit_push, static_argnames="loss")
  rng = np.random.default_rng(seed)
  logits = jnp.asarray(log_probs)
  early_push, advance_push, early_rows, early_weight = [], [], [], []
  for _ in range(batches):
    batch = chain_rollouts.sample_batch(rng, task, log_probs, cell.rollouts, check=False)
    r = batch.rollouts
    adv = estimator(r, est_opts)
    push = np.asarray(push_fn(logits, batch.states, r, adv.tokens, adv.row_mask, loss=cell.loss))
    early_push.append(push[0, ANSWER])
    advance_push.append(push[0, 1])
    early = np.asarray(r.answered) & (np.asarray(r.outcome) != 1.0)
    weight = _row_weights(r, cell.loss) * np.abs(np.asarray(adv.tokens))
    early_rows.append(early.mean())
    early_weight.append(weight[early].sum() / max(weight.sum(), 1e-12))

  def ci(xs):
    xs = np.asarray(xs, np.float64)
    return [float(xs.mean()), float(1.96 * xs.std(ddof=1) / np.sqrt(len(xs)))]

  return {"label": label, "early_answer_push": ci(early_push), "advance_push": ci(advance_push),
          "early_row_share": ci(early_rows), "early_weight_share": ci(early_weight)}


_CELLS = flags.DEFINE_string("cells", DEFAULT_CELLS, "cell labels, comma-separated")
_BATCHES = flags.DEFINE_integer("batches", 400, "rollout batches per measurement", lower_bound=1)
_EARLY = flags.DEFINE_list("early", ["none", "0.3", "0.5"],
                           "π(answer | progress 0) of the measured policies; 'none': warm start")
_JSON = flags.DEFINE_string("json", None, "write the results here")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  task = ChainTask()
  opts = PolicyOptions()
  base = np.asarray(log_policy(init_policy(jax.random.PRNGKey(0), task, opts),
                               jnp.asarray(state_features(task)),
                               jnp.asarray(prior_logits(task, opts))))
  start, results = time.perf_counter(), []
  print("| policy | cell | early-answer push | chain-tool push | early rows | early weight |")
  print("|---|---|---|---|---|---|")
  for early in _EARLY.value:
    policy = base if early == "none" else _with_early_answer(base, task, float(early))
    p0 = float(np.exp(policy[0, ANSWER]))
    for label in split_labels(_CELLS.value):
      res = measure(label, task, policy, _BATCHES.value, seed=0)
      res["p_early_answer"] = p0
      results.append(res)
      f = lambda v: f"{v[0]:+.4f} ± {v[1]:.4f}"
      print(f"| π(answer)={p0:.2f} | {label} | {f(res['early_answer_push'])} | "
            f"{f(res['advance_push'])} | {res['early_row_share'][0]:.3f} | "
            f"{res['early_weight_share'][0]:.3f} |", flush=True)
  if _JSON.value:
    with open(_JSON.value, "w") as fh:
      given = [f"--{h.name}={h.serialize().split('=', 1)[-1]}"
               for h in (_CELLS, _BATCHES, _EARLY, _JSON) if h.present]
      json.dump({"command": "python -m experiments.studies.credit_push " + " ".join(given),
                 "machine": benchmark.machine(),
                 "seconds": round(time.perf_counter() - start, 1), "results": results}, fh, indent=1)


if __name__ == "__main__":
  cli.run(main)
