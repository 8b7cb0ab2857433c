"""Credit fidelity (spec §4.5): where an estimator puts credit, against labelled turns.

    labels = episode_labels(records, task_of, num_rows, env)   # the environment's labeller
    turns = turn_table(rollouts, advantages, labels)   # one entry per (row, step)
    fidelity(turns)                                    # the measures below
    bootstrap_ci(turns, n=1000, seed=0)                # 95% intervals, queries resampled

A turn is one step of a row; its advantage is the mean of its loss tokens' advantages (what the
loss multiplies its tokens' log-probs by). A shared tree step is one turn per row that carries
it, as the loss sees it. Its label comes from the environment's registry entry
(`Environment.turn_labels`, e.g. toolworld's `env/toolworld/failures.turn_labels`): `RIGHT`,
or wrong with a kind. Over the turns of one batch:

  AUC               P(A of a random right turn > A of a random wrong turn), ties ½
                    (the Mann-Whitney U statistic over |right|·|wrong|)
  auc_query         the same over the pairs of a right and a wrong turn of one query only:
                    the contrasts a policy gradient acts on (a query-dependent baseline moves
                    a whole query's advantages, which the pooled AUC counts and the gradient
                    does not); `auc_all_fail`: over such pairs in all-fail groups only
  wrong_negative    share of wrong turns with A < 0
  collateral_blame  share of right turns in failed episodes (R_out < 0) with A < 0
  free_credit       share of wrong turns in successful episodes (R_out > 0) with A > 0
  no_signal         share of turns with A = 0; `no_signal_all_fail`: the same within groups
                    with no successful row (all-fail groups, where GRPO has nothing to give)

A measure whose denominator is empty is absent (None), never NaN. Intervals resample whole
queries with replacement (a query's rows stay together) and take the 2.5 and 97.5 percentiles.

The trainer logs these measures each step (`credit/<measure>`, `tirjax.trainer.rl_metrics`)
and writes the labels into `Rollouts.turn_label` for an estimator that reads them
(`with_turn_labels`); the credit studies (`tirjax.credit`) read them too. So they sit below
the trainer and name no environment of their own.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

import jax.numpy as jnp
import numpy as np
from scipy import stats

from tirjax.env import environments
from tirjax.env.registry import RIGHT, TurnLabels
from tirjax.rollouts import check_turn_labels

MEASURES = ("auc", "auc_query", "auc_all_fail", "wrong_negative", "collateral_blame",
            "free_credit", "no_signal", "no_signal_all_fail")


@dataclasses.dataclass(frozen=True)
class TurnTable:
  """Labelled turns, one entry each: the query (group) of its row, its advantage, its label,
  its row's outcome R_out, and whether its group had no successful row."""

  query: np.ndarray  # int
  advantage: np.ndarray  # float
  label: np.ndarray  # str: RIGHT or a wrong kind
  outcome: np.ndarray  # float, the row's R_out
  all_fail: np.ndarray  # bool

  @property
  def right(self) -> np.ndarray:
    return self.label == RIGHT

  def take(self, index: np.ndarray) -> "TurnTable":
    return TurnTable(*(getattr(self, f.name)[index] for f in dataclasses.fields(self)))


def concat(tables: Sequence[TurnTable]) -> TurnTable:
  """The turns of several tables as one (their query ids kept as they are)."""
  return TurnTable(*(np.concatenate([getattr(t, f.name) for t in tables])
                     for f in dataclasses.fields(TurnTable)))


def turn_advantages(token_advantages: np.ndarray, token_step: np.ndarray,
                    loss_mask: np.ndarray, max_steps: int) -> np.ndarray:
  """`[B, T]`: the mean advantage of each step's loss tokens (0 for a step without any)."""
  token_advantages, token_step = np.asarray(token_advantages), np.asarray(token_step)
  in_loss = np.asarray(loss_mask, bool) & (token_step >= 0)
  rows = np.broadcast_to(np.arange(token_step.shape[0])[:, None], token_step.shape)
  total = np.zeros((token_step.shape[0], max_steps))
  count = np.zeros((token_step.shape[0], max_steps))
  np.add.at(total, (rows[in_loss], token_step[in_loss]), token_advantages[in_loss])
  np.add.at(count, (rows[in_loss], token_step[in_loss]), 1)
  return np.divide(total, count, out=np.zeros_like(total), where=count > 0)


def turn_labeller(env: str) -> TurnLabels:
  """The turn labeller that environment `env` registers (`Environment.turn_labels`).

  Raises:
    ValueError: `env` registers none (no ground-truth plan to label turns from).
  """
  label = environments.get(env).turn_labels
  if label is None:
    raise ValueError(f"env {env!r} labels no turns (its registry entry has no turn_labels); "
                     f"environments that do: {', '.join(environments.names('turn_labels'))}")
  return label


def episode_labels(records: Sequence, task_of: Callable[[str], Optional[object]],
                   num_rows: int, env: str) -> list[Optional[list[str]]]:
  """Per row of a batch, its turns' labels by environment `env`'s labeller (`turn_labeller`)
  from its episode record (`.row`, `.task_id`, `.results`, `.status`, `.verdict`); None for
  padding rows and for rows whose task `task_of(task_id)` does not know."""
  label = turn_labeller(env)
  labels: list[Optional[list[str]]] = [None] * num_rows
  for rec in records:
    task = task_of(rec.task_id)
    if task is not None:
      labels[rec.row] = label(task, rec.results, rec.status == "answered", rec.verdict)
  return labels


def label_array(labels: Sequence[Optional[Sequence[str]]], step_valid) -> np.ndarray:
  """`Rollouts.turn_label` [B, T] int32 from per-row labels (`episode_labels`): +1 for `RIGHT`,
  -1 for any wrong kind, 0 on padding steps and on the steps of a row labelled None.

  Raises:
    ValueError: a labelled row whose label count is not its step count (`step_valid` [B, T]).
  """
  step_valid = np.asarray(step_valid, bool)
  out = np.zeros(step_valid.shape, np.int32)
  for b, row in enumerate(labels):
    if row is None:
      continue
    steps = int(step_valid[b].sum())
    if len(row) != steps:
      raise ValueError(f"turn_label: row {b} has {len(row)} turn labels for {steps} steps")
    out[b, :steps] = [1 if label == RIGHT else -1 for label in row]
  return out


def with_turn_labels(rollouts, labels: Sequence[Optional[Sequence[str]]]):
  """`rollouts` (this process's rows) with `turn_label` from its rows' labels (`label_array`),
  checked as `validate` checks it: what the `oracle` estimator reads (spec §4.4)."""
  label = label_array(labels, rollouts.step_valid)
  check_turn_labels({"turn_label": label, "step_valid": np.asarray(rollouts.step_valid, bool),
                     "node_id": np.asarray(rollouts.node_id)})
  return rollouts.replace(turn_label=jnp.asarray(label))


def turn_table(rollouts, token_advantages, labels: Sequence[Optional[Sequence[str]]]
               ) -> TurnTable:
  """The labelled turns of a batch.

  Args:
    rollouts: the batch's `Rollouts` (its `group_id`, `row_valid`, `outcome`, token fields).
    token_advantages: `[B, L]` an estimator's `Advantages.tokens`.
    labels: per row, one label per step (`episode_labels`), or None for a row not to count
      (padding, or a row whose task has no ground-truth plan).
  """
  adv = turn_advantages(token_advantages, rollouts.token_step, rollouts.loss_mask,
                        rollouts.max_steps)
  group, outcome = np.asarray(rollouts.group_id), np.asarray(rollouts.outcome, float)
  valid = np.asarray(rollouts.row_valid, bool)
  succeeded = {g for g in np.unique(group[valid]) if (outcome[valid & (group == g)] > 0).any()}
  cols = {f.name: [] for f in dataclasses.fields(TurnTable)}
  for b, row_labels in enumerate(labels):
    if row_labels is None or not valid[b]:
      continue
    for t, label in enumerate(row_labels):
      cols["query"].append(group[b])
      cols["advantage"].append(adv[b, t])
      cols["label"].append(label)
      cols["outcome"].append(outcome[b])
      cols["all_fail"].append(group[b] not in succeeded)
  return TurnTable(np.asarray(cols["query"], int), np.asarray(cols["advantage"], float),
                   np.asarray(cols["label"], dtype=object).astype(str),
                   np.asarray(cols["outcome"], float), np.asarray(cols["all_fail"], bool))


def auc(positive: np.ndarray, negative: np.ndarray) -> Optional[float]:
  """P(x > y) + ½ P(x = y) for x from `positive`, y from `negative` (Mann-Whitney U /
  (|positive|·|negative|), from the ranks of the pooled sample); None if either is empty."""
  n_pos, n_neg = len(positive), len(negative)
  if not n_pos or not n_neg:
    return None
  ranks = stats.rankdata(np.concatenate([positive, negative]))  # ties get their mean rank
  u = ranks[:n_pos].sum() - n_pos * (n_pos + 1) / 2
  return float(u / (n_pos * n_neg))


def query_auc(query: np.ndarray, adv: np.ndarray, right: np.ndarray) -> Optional[float]:
  """`auc` over the pairs of a right and a wrong turn of the same query: Σ_q U_q / Σ_q
  n_q⁺·n_q⁻, each U_q from the ranks within query q (ties ½); None without any such pair."""
  if not query.size:
    return None
  _, q = np.unique(query, return_inverse=True)
  # ranks within each query: rank (query, A) pairs jointly, then subtract the earlier queries'
  # counts; the global rank of A keeps its order and ties, so equal (query, A) share a rank
  key = q * (query.size + 1.0) + stats.rankdata(adv)
  count = np.bincount(q)
  within = stats.rankdata(key) - np.concatenate([[0], np.cumsum(count)[:-1]])[q]
  n_pos = np.bincount(q, weights=right, minlength=len(count))
  n_neg = count - n_pos
  u = np.bincount(q, weights=np.where(right, within, 0.0), minlength=len(count))
  u -= n_pos * (n_pos + 1) / 2
  pairs = float(np.sum(n_pos * n_neg))
  return float(np.sum(u[(n_pos > 0) & (n_neg > 0)]) / pairs) if pairs else None


def _share(hit: np.ndarray, among: np.ndarray) -> Optional[float]:
  return float(hit[among].mean()) if among.any() else None


def fidelity(turns: TurnTable) -> dict[str, Optional[float]]:
  """The measures of the module docstring over `turns` (None where undefined)."""
  right, adv = turns.right, turns.advantage
  wrong = ~right
  fail = turns.all_fail
  return {"auc": auc(adv[right], adv[wrong]),
          "auc_query": query_auc(turns.query, adv, right),
          "auc_all_fail": query_auc(turns.query[fail], adv[fail], right[fail]),
          "wrong_negative": _share(adv < 0, wrong),
          "collateral_blame": _share(adv < 0, right & (turns.outcome < 0)),
          "free_credit": _share(adv > 0, wrong & (turns.outcome > 0)),
          "no_signal": _share(adv == 0, np.ones_like(right)),
          "no_signal_all_fail": _share(adv == 0, turns.all_fail)}


def resample(turns: TurnTable, queries: Sequence[int]) -> TurnTable:
  """The turns of `queries` (ids, repeats allowed), the k-th drawn renamed query k: a query
  drawn twice is two queries of the resample, whose pairs are not crossed."""
  parts = [np.flatnonzero(turns.query == q) for q in queries]
  index = np.concatenate(parts) if parts else np.zeros(0, int)
  ids = np.repeat(np.arange(len(parts)), [len(p) for p in parts])
  return dataclasses.replace(turns.take(index), query=ids)


def bootstrap_ci(turns: TurnTable, n: int = 1000, seed: int = 0, level: float = 0.95
                 ) -> dict[str, Optional[tuple[float, float]]]:
  """Percentile intervals of each measure over `n` resamples of whole queries."""
  queries = np.unique(turns.query)
  rng = np.random.default_rng(seed)
  draws = {m: [] for m in MEASURES}
  for _ in range(n if len(queries) else 0):
    pick = queries[rng.integers(len(queries), size=len(queries))]
    for m, v in fidelity(resample(turns, pick)).items():
      if v is not None:
        draws[m].append(v)
  tail = (1 - level) / 2 * 100
  return {m: (float(np.percentile(v, tail)), float(np.percentile(v, 100 - tail))) if v else None
          for m, v in draws.items()}
