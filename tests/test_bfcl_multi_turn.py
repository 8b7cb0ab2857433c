"""BFCL multi-turn as bfcl-eval runs and scores it (spec §6.1): user turns in one episode,
held-back functions at their turn, success by bfcl-eval's own checker, per-turn matching."""

import dataclasses

import numpy as np
import pytest

from tirjax.testing import bfcl_agreement
from tirjax.env import chat
from tirjax.env.datasets import bfcl
from tirjax.env.executor import ToolEnvOptions, ToolEnv
from tirjax.env.sandbox import Sandbox
from tirjax.episodes import RolloutOptions, Shapes, rollout
from tirjax.testing.scripted_samplers import TextSampler
from tirjax.testing.reference import bfcl as ref

# Two entries per category, the miss_func entry whose held-back function comes at turn 4, and
# the long-context entry whose 34-call turn exceeds bfcl-eval's 20 steps one call at a time.
SAMPLE = ["multi_turn_base_0", "multi_turn_base_33", "multi_turn_miss_func_0",
          "multi_turn_miss_func_33", "multi_turn_miss_param_0", "multi_turn_miss_param_1",
          "multi_turn_long_context_0", "multi_turn_long_context_38"]


@pytest.fixture(scope="module")
def sandbox():
  with Sandbox() as sb:
    yield sb


@pytest.fixture(scope="module")
def tasks(sandbox):
  return {t.task_id: t for t in bfcl.load_bfcl(sandbox)}


def test_agreement_with_bfcl_eval_on_a_sample(tasks):
  result = bfcl_agreement.agreement([tasks[i] for i in SAMPLE], seed=0)
  assert result["sequences"] == 6 * len(SAMPLE)
  assert result["disagreements"] == [] and result["agreement"] == 1.0
  # Both sides score the ground truth valid, except the entry bfcl-eval force-quits.
  assert sum(result["ground_truth_valid_by_bfcl_eval"].values()) == len(SAMPLE) - 1
  perturbed = [c for c in result["by_category"].values()]
  assert sum(c["perturbed/n"] - c["perturbed/valid"] for c in perturbed) > 0


@pytest.mark.parametrize("fault", ["checker_ignored", "no_step_limit", "turns_not_separated"])
def test_agreement_fails_when_the_episode_departs_from_bfcl_eval(tasks, fault, monkeypatch):
  sample = [tasks[i] for i in SAMPLE]
  if fault == "checker_ignored":
    sample = [dataclasses.replace(t, dialogue=dataclasses.replace(
        t.dialogue, score=lambda decoded: True)) for t in sample]
  elif fault == "no_step_limit":
    sample = [dataclasses.replace(t, dialogue=dataclasses.replace(
        t.dialogue, max_steps_per_turn=10_000)) for t in sample]
  else:  # every step's calls recorded in the first turn
    monkeypatch.setattr(ToolEnv, "_dialogue_step", _one_turn_step(ToolEnv._dialogue_step))
  result = bfcl_agreement.agreement(sample, seed=0)
  assert result["agreement"] < 1.0


def _one_turn_step(step):
  def wrapped(self, text):
    result = step(self, text)
    if len(self.turn_calls) > 1 and self.turn_calls[-1]:
      self.turn_calls[0] += self.turn_calls.pop()
      self.turn_calls.append([])
    return result
  return wrapped


def test_user_turns_follow_in_order_with_the_held_back_function_at_its_turn(tasks):
  task = tasks["multi_turn_miss_func_33"]
  held = task.metadata["missed_function"]
  assert held == {"4": ["message_login"]}
  assert "message_login" not in {t.name for t in task.tools}
  assert [len(t) for t in task.metadata["gt_turns"]] == [1, 1, 1, 0, 1, 1]
  env = ToolEnv(task, ToolEnvOptions(max_steps=64))
  early = env.step(chat.format_step("t", [{"name": "message_login", "arguments": {
      "user_id": "USR001"}}]))
  assert early.checks_passed == 3 and "unknown tool" in early.error  # not offered yet ...
  assert "error" not in early.call_results[0]  # ... but run, as bfcl-eval runs what decodes
  messages = []
  for turn in range(1, 6):
    end = env.step(chat.format_answer_step("t", "done"))
    assert end.user_message is not None and not end.done and end.turn == turn - 1
    messages.append(end.user_message)
  assert messages[0] == "\n".join(m["content"] for m in task.metadata["turns"][1])
  assert "message_login" in messages[3] and "I have updated some more functions" in messages[3]
  late = env.step(chat.format_step("t", [{"name": "message_login", "arguments": {
      "user_id": "USR001"}}]))
  assert late.checks_passed == 5 and late.turn == 5  # offered from its turn on
  last = env.step(chat.format_answer_step("t", "done"))
  assert last.done and last.answered and last.success is False  # wrong calls: checker says no
  assert len(env.turn_calls) == 6 and env.turn_calls[0] == [["message_login(user_id='USR001')"]]


def test_an_episode_out_of_steps_before_its_last_turn_fails(tasks):
  task = tasks["multi_turn_base_33"]
  steps = ref.with_turn_ends(task.metadata["gt_turns"])
  ok, _ = ref.project_verdict(task, steps)
  short, _ = ref.project_verdict(task, steps, max_steps=6)
  assert ok is True and short is False


def test_rollout_of_a_dialogue_user_turns_outside_the_loss_and_per_turn_matching(tasks,
                                                                                tokenizer):
  task = tasks["multi_turn_base_33"]  # grep in turns 1 and 2
  texts = [t for turn in task.metadata["gt_turns"]
           for t in [chat.format_step("t", [c]) for c in turn]
           + [chat.format_answer_step("t", "done", "answer_tag")]]
  opts = RolloutOptions(mode="independent", n=1, max_steps=16, max_new_tokens=96,
                        answer_protocol="answer_tag", shapes=Shapes(
                            num_rows=1, max_steps=16, max_calls=2, max_gt_calls=8,
                            max_tokens=8192, max_params=8))
  batch = rollout(TextSampler(tokenizer, texts), tokenizer, [task], opts)
  r, record = batch.rollouts, batch.episodes[0]
  assert record.verdict == "true" and float(r.outcome[0]) == 1.0
  assert int(r.num_steps[0]) == len(texts) == 10
  tokens, loss = np.asarray(r.tokens[0]), np.asarray(r.loss_mask[0])
  for message in task.metadata["turns"][1:]:
    ids = chat.encode(tokenizer, message[0]["content"])
    at = _find(tokens, ids)
    assert at >= 0 and not loss[at:at + len(ids)].any()
  # Step 2 calls grep of turn 1: it is matched against turn 1's grep (GT call 1), never turn 2's.
  sim = np.asarray(r.call_sim[0])
  assert [c["name"] for c in task.flat_gt_calls] == ["ls", "grep", "grep", "send_message",
                                                     "view_messages_sent"]
  assert sim[2, 0, 1] > 0 and sim[2, 0, 2] == 0.0 and sim[4, 0, 2] > 0 and sim[4, 0, 1] == 0.0


def _find(haystack, needle) -> int:
  for i in range(len(haystack) - len(needle) + 1):
    if list(haystack[i:i + len(needle)]) == list(needle):
      return i
  return -1


# -- verdicts no episode can touch (issue 40 §9, spec §6) --------------------------------------

CHECKER = "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker"
# Code the checker would `eval`: from then on, the checker says valid to every episode ...
ALWAYS_VALID = (f"setattr(__import__('sys').modules['{CHECKER}'], 'multi_turn_checker', "
                "lambda *a, **k: {'valid': True})")
# ... or, during this very verdict, the state and response checks pass whatever they compare.
CHECKS_PASS = [f"setattr(__import__('sys').modules['{CHECKER}'], '{name}', "
               "lambda *a, **k: {'valid': True})" for name in ("state_checker",
                                                               "response_checker")]


def _no_calls(task):
  return [[ref.END_TURN] for _ in task.metadata["gt_turns"]]


def test_the_checker_injection_of_issue_40_scores_false_in_the_next_episode(tasks):
  """Layers: the parser (argument names are identifiers), a fresh checker per verdict."""
  task = tasks["multi_turn_base_0"]
  control, _ = ref.project_verdict(task, _no_calls(task))
  inject = {"name": "len", "arguments": {f"a={ALWAYS_VALID},b": 1}}
  forged, turn_calls = ref.project_verdict(task, [[[inject], ref.END_TURN]] + _no_calls(task))
  assert turn_calls[0] == []  # a malformed call: it was never decoded
  after, _ = ref.project_verdict(task, _no_calls(task))
  assert control is False and forged is False and after is False


def test_each_verdict_comes_from_a_checker_no_earlier_verdict_reached(sandbox, tasks):
  """Layer: a fresh sandbox worker per verdict. The checker `eval`s the first verdict's calls
  (given straight to it, past the parser); the second verdict is not changed by them."""
  task = tasks["multi_turn_base_0"]
  gt, entry = task.metadata["ground_truth"], {
      "id": task.task_id, "initial_config": task.metadata["initial_config"],
      "involved_classes": task.metadata["involved_classes"]}
  category = task.metadata["category"]
  decoded = [[[f"len(a={ALWAYS_VALID},b=1)"]]] + [[] for _ in gt[1:]]
  assert bfcl.checker_verdict(sandbox, decoded, gt, entry, category)["valid"] is False
  assert bfcl.checker_verdict(sandbox, [[] for _ in gt], gt, entry, category)["valid"] is False
  assert sandbox.live_workers == 0 or not any(ns.startswith("bfcl/checker") for ns in
                                              sandbox._workers)


def test_a_call_of_a_name_outside_the_entrys_functions_never_reaches_the_checkers_eval(tasks):
  """Layer: `only_methods`. With identifier names only, bfcl-eval's checker would evaluate a
  call of its own `execute_multi_turn_func_call`, which `eval`s the strings it is given:
  enough to pass this very episode."""
  task = tasks["multi_turn_base_0"]
  exploit = {"name": "execute_multi_turn_func_call", "arguments": {
      "func_call_list": CHECKS_PASS, "initial_config": {}, "involved_classes": [],
      "model_name": "m", "test_entry_id": "e"}}
  steps = [[[exploit], ref.END_TURN] for _ in task.metadata["gt_turns"]]
  forged, turn_calls = ref.project_verdict(task, steps)
  assert turn_calls[0][0][0].startswith("execute_multi_turn_func_call(")  # it was decoded
  assert forged is False
  assert bfcl.only_methods([[["cd(folder='x')", "len(x=1)"]]], {"cd"}) == [[[
      "cd(folder='x')", "len__is_not_a_function_of_this_entry()"]]]
