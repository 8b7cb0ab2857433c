"""The trainer's multi-process plumbing (`tirjax.distributed`, spec §9): each process samples
its share of a step's queries into its block of the global batch, and process 0 writes the
run directory. With one process the share is the whole step and every function here is the
identity or the plain file operation.

    share = StepShare.of(mesh, rules, exp.rollout, exp.train.queries_per_step)
    local = rollout(sampler, tokenizer, share.tasks(step_tasks), share.rollout, judge, rng,
                    first_query=share.first_query)          # this process's rows
    rollouts = share.global_rollouts(local)                 # the step's global batch
    mine = share.local_advantages(adv)                      # this process's rows, for metrics
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Sequence

import numpy as np

from tirjax import distributed, rundir, sharding
from tirjax.advantages.registry import Advantages
from tirjax.episodes.options import RolloutOptions
from tirjax.rollouts import Rollouts

# The advantages' per-row fields: the rows a process's host metrics read.
_ADVANTAGE_ROWS = ("tokens", "steps", "rows", "row_reward", "row_mask")


@dataclasses.dataclass(frozen=True)
class StepShare:
  """This process's share of every RL step.

  Attributes:
    rows: its block of the global batch's rows (`distributed.RowShare`).
    rollout: the rollout options of its rows (the block's `shapes.num_rows`).
    queries: its queries per step.
    mesh, rules: the global batch's mesh and logical rules.
  """

  rows: distributed.RowShare
  rollout: RolloutOptions
  queries: int
  mesh: Any
  rules: Any

  @classmethod
  def of(cls, mesh, rules, rollout: RolloutOptions, queries_per_step: int) -> "StepShare":
    rows = distributed.row_share(mesh, rules, rollout.shapes.num_rows)
    local = dataclasses.replace(rollout, shapes=dataclasses.replace(
        rollout.shapes, num_rows=rows.stop - rows.start))
    return cls(rows, local, queries_per_step // rows.count, mesh, rules)

  @property
  def first_query(self) -> int:
    """The step-wide index of this process's first query (its rows' sampling streams are
    named by it, so a share samples the rows the whole batch would)."""
    return self.rows.index * self.queries

  def tasks(self, step_tasks: Sequence) -> list:
    """This process's queries among the step's."""
    return self.rows.of(step_tasks)

  def global_rollouts(self, local: Rollouts) -> Rollouts:
    """The step's batch from every process's rows: the batch-global segment ids (`group_id`,
    `node_id`, `state_id`) move to this process's block first."""
    if not distributed.is_multiprocess():
      return local
    start, node = self.rows.start, np.asarray(local.node_id)
    local = local.replace(group_id=np.asarray(local.group_id) + start,
                          node_id=np.where(node >= 0, node + start * local.max_steps, node))
    if local.state_id is not None:  # anchor states (GiGPO) are batch-global like node ids
      state = np.asarray(local.state_id)
      local = local.replace(state_id=np.where(state >= 0, state + start * local.max_steps,
                                              state))
    return sharding.shard_batch(local, self.mesh, self.rules)  # the global arrays

  @staticmethod
  def local_advantages(adv: Advantages) -> Advantages:
    """This process's rows of the global batch's advantages (host metrics of its own rows)."""
    return adv.replace(extras={}, **{f: distributed.local_rows(getattr(adv, f))
                                     for f in _ADVANTAGE_ROWS})


def claim_workdir(workdir: str, record: Mapping[str, Any]) -> bool:
  """Process 0 claims `workdir` for the config `record` (`rundir.claim`); every process learns
  whether it resumes, or raises `rundir.WorkdirMismatch` when process 0 was refused."""
  refused, resuming = None, False
  if distributed.is_primary():
    try:
      resuming = rundir.claim(workdir, record)
    except rundir.WorkdirMismatch as e:
      refused = e
  if not distributed.agree(refused is None):
    raise refused or rundir.WorkdirMismatch(f"{workdir}: refused by process 0")
  return bool(distributed.agree(resuming))


def exists(path: str) -> bool:
  """Whether `path` exists, as process 0 sees it (every process then takes the same branch)."""
  return bool(distributed.agree(os.path.exists(path)))


def write_json(path: str, obj: Any) -> None:
  """`rundir.write_json` on process 0 (the run directory's writer)."""
  if distributed.is_primary():
    rundir.write_json(path, obj)
