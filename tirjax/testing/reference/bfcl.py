"""BFCL multi-turn scored the way bfcl-eval scores it, for the agreement check (spec §6.1).

`reference_verdict` composes bfcl-eval's own functions the way its pipeline does, in this
process and without tirjax's episode code: the inference loop (`BaseHandler.inference_multi_turn_*`:
a step whose output decodes to calls is kept and the turn goes on; the first step that does
not decode, or decodes to nothing, ends the turn; more than `MAXIMUM_STEP_LIMIT` steps in a turn
force-quit the entry), the evaluation runner (`_evaluate_single_multi_turn_entry`: a result
with fewer turns than the ground truth fails as force-terminated; each kept step decoded with
`convert_to_function_call`, as the FC handlers do) and its `multi_turn_checker`. The runner
module itself is not imported: it pulls in every model vendor's SDK.

`project_verdict` runs the same step outputs through tirjax: the step text of the chat
format, the parser, `ToolEnv`'s dialogue turns, the BFCL back-end in the sandbox and the
checker in the sandbox.

A model's turn is a list of step outputs: a list of calls `{"name", "arguments"}` or, to end
the turn, `None` (a message without a call). `perturbations` derives wrong call sequences from
the ground truth.
"""

from __future__ import annotations

import copy
import itertools
import re
from typing import Any, Optional, Sequence

import numpy as np

from tirjax.env import chat
from tirjax.env.executor import ToolEnvOptions, ToolEnv
from tirjax.env.tools import Task

END_TURN = None  # a step output without a call
_names = itertools.count()


def with_turn_ends(turns: Sequence[Sequence[list]]) -> list[list]:
  """Each turn's calls as one step each, then a message that ends the turn."""
  return [[[call] for call in turn] + [END_TURN] for turn in turns]


def reference_verdict(entry: dict, ground_truth: Sequence[Sequence[str]], category: str,
                      turns: Sequence[Sequence[Optional[list]]],
                      raw_calls: Optional[Sequence[Sequence[str]]] = None) -> tuple[bool, list]:
  """(valid, decoded per turn) as bfcl-eval's pipeline scores these step outputs. With
  `raw_calls` (the ground truth's own call strings), each turn's steps are those strings, one
  per step (replacing `turns`), as a model that emitted exactly the ground truth, one call at a
  time, would have them decoded; the step limit applies to them as to any model."""
  from bfcl_eval.constants.default_prompts import MAXIMUM_STEP_LIMIT
  from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker, multi_turn_utils
  from bfcl_eval.model_handler.utils import convert_to_function_call

  if raw_calls is not None:  # the ground truth's own strings, one call per step
    turns = [[[c] for c in turn] + [END_TURN] for turn in raw_calls]
  decoded = []
  for steps in turns:
    kept = []
    for out in steps:
      if out is END_TURN:
        break
      step = (out if raw_calls is not None
              else convert_to_function_call([{c["name"]: c["arguments"]} for c in out]))
      if multi_turn_utils.is_empty_execute_response(step):
        break
      kept.append(step)
      if len(kept) > MAXIMUM_STEP_LIMIT:
        return False, decoded + [kept]  # force-quit: the entry has fewer turns
    decoded.append(kept)
  if len(decoded) != len(ground_truth):
    return False, decoded
  model = f"reference_{next(_names)}"
  try:
    out = multi_turn_checker.multi_turn_checker(decoded, list(ground_truth), entry, category,
                                                model)
  finally:
    prefix = re.sub(r"[-./:]", "_", model)
    for key in [k for k in vars(multi_turn_utils) if k.startswith(prefix)]:
      del vars(multi_turn_utils)[key]
  return bool(out["valid"]), decoded


def project_verdict(task: Task, turns: Sequence[Sequence[Optional[list]]],
                    max_steps: int = 512) -> tuple[Optional[bool], list]:
  """(success, decoded per turn) of tirjax's episode over these step outputs."""
  env = ToolEnv(task, ToolEnvOptions(max_steps=max_steps))
  result = None
  try:
    for steps in turns:
      for out in steps:
        text = (chat.format_answer_step("The request is handled.", "done")
                if out is END_TURN else chat.format_step("Next call.", out))
        result = env.step(text)
        if result.done or out is END_TURN:
          break
      if result is not None and result.done:
        break
    return (result.success if result is not None and result.done else False), env.turn_calls
  finally:
    env.close()


def perturbations(gt_turns: Sequence[Sequence[dict]], rng: np.random.Generator) -> dict:
  """Five wrong variants of the ground truth (each a list of turns of calls); a variant that
  cannot change this entry (e.g. no argument anywhere) changes something else, named so."""
  turns = [list(t) for t in copy.deepcopy(gt_turns)]
  calls = [(i, j) for i, t in enumerate(turns) for j in range(len(t))]
  out = {}

  drop = copy.deepcopy(turns)
  last = max(i for i, _ in calls)
  drop[last].pop()
  out["drop_last_call"] = drop

  arg = copy.deepcopy(turns)
  with_args = [(i, j) for i, j in calls if arg[i][j]["arguments"]]
  if with_args:
    i, j = with_args[rng.integers(len(with_args))]
    key = sorted(arg[i][j]["arguments"])[rng.integers(len(arg[i][j]["arguments"]))]
    arg[i][j]["arguments"][key] = _perturbed(arg[i][j]["arguments"][key])
    out["perturb_argument"] = arg
  else:
    i, j = calls[rng.integers(len(calls))]
    arg[i][j]["name"] += "_x"
    out["perturb_name"] = arg

  out["no_calls"] = [[] for _ in turns]

  dup = copy.deepcopy(turns)
  i, j = calls[rng.integers(len(calls))]
  dup[i].insert(j, copy.deepcopy(dup[i][j]))
  out["duplicate_call"] = dup

  order = copy.deepcopy(turns)
  long_turns = [i for i, t in enumerate(order) if len(t) >= 2]
  if long_turns:
    i = long_turns[rng.integers(len(long_turns))]
    order[i].reverse()
    out["reorder_turn"] = order
  else:  # one call per turn: move a call into the turn before (or after) it
    i, _ = calls[-1]
    k = i - 1 if i > 0 else i + 1
    if k < len(order):
      order[k].append(order[i].pop())
      out["move_call_across_turns"] = order
    else:  # a single call in a single turn
      order[i].pop(0)
      out["drop_first_call"] = order
  return out


def _perturbed(value: Any) -> Any:
  if isinstance(value, bool):
    return not value
  if isinstance(value, int):
    return value + 1
  if isinstance(value, float):
    return value + 1.5
  if isinstance(value, str):
    return value + "_x"
  if isinstance(value, list):
    return value[:-1] if value else ["x"]
  if isinstance(value, dict):
    return {**value, "x": 1}
  return "x"
