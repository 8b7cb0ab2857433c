"""Build a `Rollouts` batch from plain Python records: groups → rows → steps → calls.

For tests and small experiments. A tree is written by labelling steps: within one group,
steps with the same `node` label are the same tree node (rows that share a prefix repeat the
labels of that prefix); a step without a label is a fresh node. Example, two rows that share
their first step and then branch::

    GroupRecord(gt_calls=[{"name": "add", "arguments": {"a": 1, "b": 2}}], rows=[
        RowRecord(outcome=1, steps=[StepRecord(node="s1"), StepRecord(node="s1a")]),
        RowRecord(outcome=-1, steps=[StepRecord(node="s1"), StepRecord(node="s1b")]),
    ])

Shapes default to the smallest that fit; pass them to pad to fixed shapes (so that a jitted
kernel compiles once across many batches).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Hashable, Optional, Sequence

import jax.numpy as jnp
import numpy as np

from tirjax.matching.encoding import CallEncoder
from tirjax.testing.critic_values import prefix_value_array
from tirjax.matching.similarity import call_similarity
from tirjax.rollouts import (Rollouts, call_encoding, empty_arrays, from_numpy, state_ids,
                             write_tokens)

TERMINAL_TOOL = "response_gen"


@dataclasses.dataclass
class StepRecord:
  calls: Sequence[dict] = ()  # [{"name": str, "arguments": {...}}]; terminal calls are dropped
  format_reward: float = 0.25
  node: Optional[Hashable] = None
  tokens: Sequence[int] = (1,)  # generated tokens of the step (loss_mask = 1)
  logprobs: Optional[Sequence[float]] = None
  response_tokens: Sequence[int] = ()  # tool-response tokens after the step (loss_mask = 0)
  solves: Optional[Sequence[bool]] = None  # per kept call: output verified an expected answer
  right: Optional[bool] = None  # its ground-truth label (`with_labels`); None: format_reward > 0
  # log P(gold answer | history before the step) (`with_answer_logprob`, IGPO's probe);
  # None: log(0.5 + format_reward), so that the steps of one tree node agree
  answer_logprob: Optional[float] = None


@dataclasses.dataclass
class RowRecord:
  steps: Sequence[StepRecord]
  outcome: float
  answered: Optional[bool] = None  # default: outcome != -1 or the last step called the answer
  answer_score: Optional[float] = None  # default: 1.0 if outcome == 1 else 0.0
  prompt_tokens: Sequence[int] = (1,)
  policy_version: int = 0
  ref_logprobs: Optional[Sequence[float]] = None  # per token of the whole row


@dataclasses.dataclass
class GroupRecord:
  rows: Sequence[RowRecord]
  gt_calls: Sequence[dict] = ()
  num_expected: int = 0  # FTRL: size of the query's expected-answer set
  greedy_outcome: float = -1.0  # R_out of the query's greedy rollout (ReMax; `with_greedy`)


def _kept_calls(step: StepRecord, terminal_tool: str):
  return [c for c in step.calls if c.get("name") != terminal_tool]


def build_rollouts(
    groups: Sequence[GroupRecord],
    *,
    num_rows: Optional[int] = None,
    max_steps: Optional[int] = None,
    max_calls: Optional[int] = None,
    max_gt_calls: Optional[int] = None,
    max_tokens: Optional[int] = None,
    max_params: Optional[int] = None,
    with_ftrl: bool = False,
    with_ref: bool = False,
    with_greedy: bool = False,
    with_labels: bool = False,
    with_values: bool = False,
    with_answer_logprob: bool = False,
    terminal_tool: str = TERMINAL_TOOL,
) -> Rollouts:
  """Pads the records into a validated `Rollouts` with encodings and `call_sim` filled in.

  `state_id` is always filled: steps of a group whose earlier steps made the same calls (the
  terminal call included) and got the same response tokens share an anchor state.
  `with_greedy` adds each group's `greedy_outcome`; `with_ref` and `with_ftrl` add
  `ref_logprobs` and `call_solves` / `num_expected`; `with_labels` adds `turn_label`, each
  step's `right` (+1 / -1), a step without one right when its format_reward is positive (so
  that the steps of one tree node agree, as they must). `with_values` adds a stand-in critic's
  `values`, one per token prefix (`tirjax.testing.critic_values`). `with_answer_logprob` adds
  each step's `answer_logprob` (IGPO's probe before it; `StepRecord.answer_logprob`).
  """
  rows = [(g, row) for g, grp in enumerate(groups) for row in grp.rows]
  steps = [s for _, row in rows for s in row.steps]
  need = dict(
      num_rows=len(rows),
      max_steps=max([len(r.steps) for _, r in rows], default=0),
      max_calls=max([len(_kept_calls(s, terminal_tool)) for s in steps], default=0),
      max_gt_calls=max([len(g.gt_calls) for g in groups], default=0),
      max_tokens=max([_row_len(r) for _, r in rows], default=0),
      max_params=max([len(c.get("arguments") or {}) for s in steps
                      for c in _kept_calls(s, terminal_tool)] +
                     [len(c.get("arguments") or {}) for g in groups for c in g.gt_calls],
                     default=0),
  )
  given = dict(num_rows=num_rows, max_steps=max_steps, max_calls=max_calls,
               max_gt_calls=max_gt_calls, max_tokens=max_tokens, max_params=max_params)
  size = {}
  for k, n in need.items():
    if given[k] is not None and given[k] < n:
      raise ValueError(f"{k}={given[k]} is too small for these records (they need {n})")
    size[k] = max(1, given[k] if given[k] is not None else n)
  B, T, K, C, L, P = (size[k] for k in ("num_rows", "max_steps", "max_calls", "max_gt_calls",
                                          "max_tokens", "max_params"))

  a = empty_arrays(B, T, K, C, L, P, optional=("ref_logprobs", "call_solves", "num_expected",
                                                "greedy_outcome", "turn_label",
                                                "answer_logprob"))
  step_keys: dict[str, int] = {}
  step_key = np.zeros((B, T), np.int64)
  ref, solves, num_expected = a["ref_logprobs"], a["call_solves"], a["num_expected"]
  e = {k[len("calls."):]: v for k, v in a.items() if k.startswith("calls.")}
  enc = CallEncoder()

  node_ids: dict[tuple[int, Hashable], int] = {}
  next_node = 0
  for b, (g, row) in enumerate(rows):
    grp = groups[g]
    a["group_id"][b] = g
    a["row_valid"][b] = True
    a["outcome"][b] = row.outcome
    a["num_steps"][b] = len(row.steps)
    last_calls = row.steps[-1].calls if row.steps else ()
    answered = row.answered if row.answered is not None else (
        row.outcome != -1 or any(c.get("name") == terminal_tool for c in last_calls))
    a["answered"][b] = bool(answered) and len(row.steps) > 0
    a["answer_score"][b] = (row.answer_score if row.answer_score is not None
                            else float(row.outcome == 1))
    a["policy_version"][b] = row.policy_version
    a["greedy_outcome"][b] = grp.greedy_outcome
    num_expected[b] = grp.num_expected
    for c, call in enumerate(grp.gt_calls):
      a["gt_valid"][b, c] = True
      e["gt_name"][b, c], e["gt_keys"][b, c], e["gt_values"][b, c] = enc.encode(call, P)
    pos = write_tokens(a, b, 0, row.prompt_tokens)
    for t, step in enumerate(row.steps):
      a["step_valid"][b, t] = True
      a["format_reward"][b, t] = step.format_reward
      right = step.right if step.right is not None else step.format_reward > 0
      a["turn_label"][b, t] = 1 if right else -1
      a["answer_logprob"][b, t] = (step.answer_logprob if step.answer_logprob is not None
                                   else np.log(0.5 + step.format_reward))
      if step.node is None:
        node = next_node
        next_node += 1
      else:
        key = (g, step.node)
        if key not in node_ids:
          node_ids[key] = next_node
          next_node += 1
        node = node_ids[key]
      a["node_id"][b, t] = node
      seen = json.dumps([list(step.calls), list(step.response_tokens)], sort_keys=True)
      step_key[b, t] = step_keys.setdefault(seen, len(step_keys))
      kept = _kept_calls(step, terminal_tool)
      for k, call in enumerate(kept):
        a["call_valid"][b, t, k] = True
        e["pred_name"][b, t, k], e["pred_keys"][b, t, k], e["pred_values"][b, t, k] = (
            enc.encode(call, P))
        if step.solves is not None:
          solves[b, t, k] = bool(step.solves[k])
      pos = write_tokens(a, b, pos, step.tokens, step.logprobs, t)
      pos = write_tokens(a, b, pos, step.response_tokens)
    if row.ref_logprobs is not None:
      ref[b, :len(row.ref_logprobs)] = row.ref_logprobs
  if next_node > B * T:
    raise ValueError(f"the records use {next_node} tree nodes; B*T={B * T} ids are available")

  a["call_sim"] = call_similarity(call_encoding(a), jnp.asarray(a["call_valid"]),
                                  jnp.asarray(a["gt_valid"]))
  a["state_id"] = state_ids(a["group_id"], step_key, a["step_valid"])
  for name, keep in (("ref_logprobs", with_ref), ("call_solves", with_ftrl),
                     ("num_expected", with_ftrl), ("greedy_outcome", with_greedy),
                     ("turn_label", with_labels), ("answer_logprob", with_answer_logprob)):
    if not keep:
      del a[name]
  if with_values:
    a["values"] = prefix_value_array(a["tokens"], a["token_valid"])
  return from_numpy(a)


def _row_len(row: RowRecord) -> int:
  return len(row.prompt_tokens) + sum(len(s.tokens) + len(s.response_tokens) for s in row.steps)



