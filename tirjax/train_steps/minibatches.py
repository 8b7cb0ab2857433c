"""Several updates per rollout batch: whole query groups shuffled into mini-batches (spec §5.1).

    state, updates = update_passes(state, train_step, batch, group_id, row_valid,
                                   num_minibatches, ppo_epochs, seed=seed, step=step)
    # each pass: rows = minibatch_rows(group_id, row_valid, M, rng([seed, step, pass]));
    #            an update per mini-batch, on gather_rows(batch, rows[m], ...)

A rollout batch of Q queries feeds `ppo_epochs` passes; each pass shuffles the query groups
into M = Q / `mini_batch_queries` mini-batches, and each mini-batch is one optimizer update
with its own loss denominators (verl's actor: `ppo_epochs` over `ppo_mini_batch_size`; TRL's
`num_iterations`; Tunix's `mini_batch_size`). Advantages, the sampler's log-probs and the
reference's are the rollout batch's, computed once before the first update; from the second
update on the policy differs from the sampler's, so π/π_old ≠ 1 and the clip acts.

Whole groups stay together, so a mini-batch's group statistics are those the estimator saw.
Every mini-batch has B / M rows: its groups' rows, then padding rows of the batch (which are
out of the loss) to fill it, so one shape compiles once. The gather runs on the global batch,
so in a multi-process run a mini-batch holds whichever processes' rows its groups have, and
the updates are those of one process with the whole batch.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec


def minibatch_rows(group_id: np.ndarray, row_valid: np.ndarray, num_minibatches: int,
                   rng: np.random.Generator) -> np.ndarray:
  """The rows of each mini-batch of one pass: `[num_minibatches, B / num_minibatches]`.

  The valid rows' groups are shuffled by `rng` and dealt into `num_minibatches` runs of
  consecutive groups (as even as the count allows); mini-batch m holds its groups' rows in
  batch order, then padding rows (`row_valid` False) until it has B / M rows. With one
  mini-batch the rows are the batch's, in order (nothing is shuffled or moved).

  Raises:
    ValueError: M does not divide B, or a mini-batch's groups have more than B / M rows.
  """
  group_id, row_valid = np.asarray(group_id), np.asarray(row_valid, bool)
  rows = len(group_id)
  if num_minibatches < 1 or rows % num_minibatches:
    raise ValueError(f"num_minibatches: {num_minibatches} does not divide the batch of {rows} "
                     "rows")
  if num_minibatches == 1:
    return np.arange(rows)[None]
  per = rows // num_minibatches
  groups = rng.permutation(np.unique(group_id[row_valid]))
  out = np.empty((num_minibatches, per), np.int64)
  taken = np.zeros(rows, bool)
  fill = []
  for m, part in enumerate(np.array_split(groups, num_minibatches)):
    mine = np.flatnonzero(row_valid & np.isin(group_id, part))
    if len(mine) > per:
      raise ValueError(f"mini-batch {m}: its {len(part)} groups have {len(mine)} rows, more than "
                       f"the {per} rows of a mini-batch (groups of unequal size)")
    out[m, :len(mine)] = mine
    taken[mine] = True
    fill.append(len(mine))
  spare = np.flatnonzero(~taken)  # padding rows (and the rows of no group: none are valid)
  start = 0
  for m, used in enumerate(fill):
    out[m, used:] = spare[start:start + per - used]
    start += per - used
  return out


def gather_rows(batch: Any, rows: np.ndarray, sharding: NamedSharding) -> Any:
  """Rows `rows` of every leaf of a batch-sharded pytree, placed by `sharding` (the rows over
  the batch axes). Works on global arrays: the same `rows` on every process."""
  rows = np.asarray(rows, np.int32)
  replicated = NamedSharding(sharding.mesh, PartitionSpec())
  index = jax.make_array_from_callback(rows.shape, replicated, lambda i: rows[i])
  return _gather(batch, index, sharding)


def _gather(batch, index, sharding):
  fn = jax.jit(lambda b, i: jax.tree.map(lambda x: x[i], b),
               out_shardings=jax.tree.map(lambda _: sharding, batch))
  with jax.set_mesh(sharding.mesh):
    return fn(batch, index)


def update_passes(state, train_step, batch, group_id: np.ndarray, row_valid: np.ndarray,
                  num_minibatches: int, ppo_epochs: int, *, seed: int, step: int):
  """`ppo_epochs` passes over a rollout batch, each shuffling its query groups into
  `num_minibatches` mini-batches (`minibatch_rows`, seeded by the run's `seed`, the RL `step`
  and the pass), one `train_step` update each. With one mini-batch the batch is updated on as
  it is (no gather), so one pass is exactly the single-update step.

  Args:
    state: the train state (`tirjax.checkpoint.TrainState`).
    train_step: a `tirjax.train_steps.step.TrainStep` (its `prepare` makes each mini-batch: rows
      gathered on device, or packed forests).
    batch: the rollout batch's `PolicyBatch` (host arrays, or global arrays).
    group_id, row_valid: [B] the batch's group ids and valid rows, whole on every process.

  Returns:
    The state after every update, and each update's metrics (host values), in order.
  """
  select = train_step.prepare(batch, group_id)  # rows -> the step's input (None: all)
  updates = []
  for epoch in range(ppo_epochs):
    if num_minibatches == 1:
      minibatches = [None]
    else:
      minibatches = minibatch_rows(group_id, row_valid, num_minibatches,
                                   np.random.default_rng([seed, step, epoch]))
    for rows in minibatches:
      state, metrics = train_step(state, select(rows))
      updates.append(jax.device_get(jax.block_until_ready(metrics)))
  jax.block_until_ready(state.params)
  return state, updates


# The per-update diagnostics a step reports at its last update too: how far the policy has
# moved from the sampler's by then, and how much the clip acts.
LAST_UPDATE_KEYS = ("metrics/clip_frac_low", "metrics/clip_frac_high", "metrics/clip_frac_dual",
                    "metrics/approx_kl_k1", "metrics/approx_kl_k3", "metrics/ratio/std")


def combine_updates(updates: Sequence[Mapping[str, Any]]
                    ) -> tuple[dict[str, float], dict[str, float]]:
  """One step's metrics from its updates' (in order): (the mean over updates of each scalar,
  the smallest of `/min` keys, the largest of `/max` keys; `updates/count` and
  `updates/last/<key>`, the last update's value of each of `LAST_UPDATE_KEYS`). With one
  update the first is that update's metrics."""
  if not updates:
    raise ValueError("updates: a step makes at least one update")
  out: dict[str, float] = {}
  for key in updates[0]:
    values = np.asarray([float(np.asarray(u[key])) for u in updates])
    if key.endswith("/min"):
      out[key] = float(values.min())
    elif key.endswith("/max"):
      out[key] = float(values.max())
    else:
      out[key] = float(values.mean())
  last = {"updates/count": float(len(updates))}
  for key in LAST_UPDATE_KEYS:
    if key in updates[-1]:
      last[f"updates/last/{key.removeprefix('metrics/')}"] = float(np.asarray(updates[-1][key]))
  return out, last
