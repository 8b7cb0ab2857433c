"""toolworld demos: correct and imperfect trajectories, executed responses, token ids + mask."""

import collections
import json
import re

import pytest

from tirjax.env import chat
from tirjax.env.tools import TERMINAL_TOOL, UNABLE_TO_ANSWER, ToolError
from tirjax.env.toolworld.plan import canonical_schedule
from tirjax.env.toolworld.demos import DemoOptions, demo_tokens, make_demos
from tirjax.env.toolworld.tasks import Difficulty, make_tasks
from tirjax.env.toolworld.toolbox import UNAVAILABLE

STEP = re.compile(r"<think>([^<]*)</think><tool_call>(.*)</tool_call>", re.S)
ANSWER = re.compile(r"<think>([^<]*)</think><answer>(.*)</answer>", re.S)


@pytest.fixture(scope="module")
def tasks():
  return make_tasks("train", 300, seed=2,
                    difficulty=Difficulty(hop_weights=(1, 1, 1, 1), p_down=0.2))


@pytest.fixture(scope="module")
def demos(tasks):
  return make_demos(tasks, seed=0, options=DemoOptions(p_recover=0.3, p_detour=0.2,
                                                        p_reorder=0.5))


def _direct(task, call):
  tool = {t.name: t for t in task.tools}[call["name"]]
  try:
    return {"name": call["name"], "result": tool.fn(**call["arguments"])}
  except ToolError as e:
    return {"name": call["name"], "error": str(e)}


def _parse(demo, protocol="response_gen"):
  """(steps as lists of calls, tool entries per step, final answer) from the messages."""
  msgs = demo.messages
  assert [m["role"] for m in msgs[:2]] == ["system", "user"]
  assert [m["role"] for m in msgs[2:]] == ["assistant", "tool"] * ((len(msgs) - 3) // 2) + [
      "assistant"]
  steps, entries = [], []
  for m in msgs[2:-1]:
    if m["role"] == "assistant":
      think, body = STEP.fullmatch(m["content"]).groups()
      calls = json.loads(body)
      assert think and calls and all(set(c) == {"name", "arguments"} for c in calls)
      steps.append(calls)
    else:
      entries.append(json.loads(m["content"]))
  if protocol == "answer_tag":
    answer = ANSWER.fullmatch(msgs[-1]["content"]).group(2)
  else:
    (final,) = json.loads(STEP.fullmatch(msgs[-1]["content"]).group(2))
    assert final["name"] == TERMINAL_TOOL
    answer = final["arguments"]["answer"]
  return steps, entries, answer


def test_every_demo_answers_the_reference_with_executed_responses(tasks, demos):
  for task, demo in zip(tasks, demos):
    steps, entries, answer = _parse(demo)
    assert answer == demo.answer == task.answer
    for calls, got in zip(steps, entries):  # responses are the tools' own outputs
      assert got == [_direct(task, c) for c in calls]
    json.dumps(demo.messages)


def test_correct_demos_follow_a_valid_order_of_the_plan(tasks, demos):
  reordered = 0
  for task, demo in zip(tasks, demos):
    if demo.kind != "correct":
      continue
    steps, entries, _ = _parse(demo)
    assert not any("error" in e for es in entries[:-1] for e in es)
    if task.metadata["down"] is not None:
      assert any(e.get("error") == UNAVAILABLE for e in entries[-1])
      continue
    plan = task.metadata["plan"]
    index = {json.dumps(c, sort_keys=True): i for i, c in zip(
        [i for layer in canonical_schedule(plan) for i in layer], task.flat_gt_calls)}
    done = set()
    for step in steps:
      ids = [index[json.dumps(c, sort_keys=True)] for c in step]
      for i in ids:  # every call comes after the calls whose results it uses
        assert set(re.findall(r'"\$ref": (\d+)', json.dumps(plan[i]["arguments"]))) <= {
            str(j) for j in done}
      done.update(ids)
    assert done == set(range(len(plan)))
    reordered += steps != [list(s) for s in task.gt_calls]
  assert reordered > 10


def test_recover_demos_show_an_error_then_the_right_call(tasks, demos):
  recovered = 0
  for task, demo in zip(tasks, demos):
    if demo.kind != "recover":
      continue
    steps, entries, answer = _parse(demo)
    failed = [(s, e) for s, es in enumerate(entries) for e in es
              if "error" in e and e["error"] != UNAVAILABLE]
    assert len(failed) == 1
    s, error = failed[0]
    retry = steps[s + 1]
    assert len(retry) == 1 and retry[0]["name"] == error["name"]
    assert "result" in entries[s + 1][0]
    assert STEP.fullmatch(demo.messages[2 + 2 * (s + 1)]["content"]).group(1).startswith("Retry.")
    trained = [m.get("train", True) for m in demo.messages if m["role"] == "assistant"]
    assert trained == [k != s for k in range(len(trained))]  # the failed step is context only
    assert answer == task.answer
    recovered += 1
  assert recovered > 40


def test_detour_demos_add_one_harmless_call(tasks, demos):
  detours = 0
  for task, demo in zip(tasks, demos):
    if demo.kind != "detour" or task.metadata["down"]:
      continue
    steps, entries, answer = _parse(demo)
    calls = [c for s in steps for c in s]
    gt = [c for s in task.gt_calls for c in s]
    assert len(calls) == len(gt) + 1
    extra = [c for c in calls if c not in gt]
    assert len(extra) == 1 and extra[0]["name"].endswith("_info")
    assert "result" in _direct(task, extra[0])
    assert answer == task.answer
    detours += 1
  assert detours > 30


def test_kind_shares_follow_the_options(tasks):
  counts = collections.Counter(d.kind for d in make_demos(tasks, seed=1))
  defaults = DemoOptions()
  assert counts["recover"] <= (defaults.p_recover + 0.1) * len(tasks)
  assert counts["detour"] <= (defaults.p_detour + 0.1) * len(tasks)
  assert counts["correct"] >= 0.6 * len(tasks)
  only = make_demos(tasks[:50], options=DemoOptions(p_recover=0, p_detour=0))
  assert {d.kind for d in only} == {"correct"}
  again = make_demos(tasks[:50], options=DemoOptions(p_recover=0, p_detour=0))
  assert [d.messages for d in only] == [d.messages for d in again]


def test_answer_tag_protocol(tasks):
  for task, demo in zip(tasks[:80], make_demos(
      tasks[:80], options=DemoOptions(answer_protocol="answer_tag"))):
    _, _, answer = _parse(demo, "answer_tag")
    assert answer == task.answer
    assert TERMINAL_TOOL not in [t["function"]["name"] for t in demo.tools]
    assert demo.messages[0]["content"] == chat.SYSTEM_PROMPTS["answer_tag"]


def test_down_demos_answer_unable(tasks, demos):
  down = [(t, d) for t, d in zip(tasks, demos) if t.metadata["down"]]
  assert len(down) > 20
  for task, demo in down:
    steps, entries, answer = _parse(demo)
    assert answer == UNABLE_TO_ANSWER
    assert {"name": task.metadata["down"], "error": UNAVAILABLE} in entries[-1]


def test_demo_tokens_and_loss_mask(tokenizer, demos):
  end = tokenizer.convert_tokens_to_ids("<|im_end|>")
  for demo in demos[:150]:
    ids, mask = demo_tokens(tokenizer, demo)
    text = chat.render_conversation(demo.messages, demo.tools)
    assert tokenizer.decode(ids) == text
    assert ids == tokenizer.encode(text, add_special_tokens=False)
    assert set(mask) == {0, 1} and len(mask) == len(ids)
    masked = tokenizer.decode([i for i, m in zip(ids, mask) if m])
    assert masked == "".join(m["content"] + "<|im_end|>" for m in demo.messages
                             if m["role"] == "assistant" and m.get("train", True))
    trained_turns = sum(m["role"] == "assistant" and m.get("train", True) for m in demo.messages)
    starts = [k for k in range(len(ids)) if mask[k] and not mask[k - 1]]
    assert len(starts) == trained_turns
    for k in starts:  # each assistant run starts right after "<|im_start|>assistant\n"
      assert tokenizer.decode(ids[:k]).endswith("<|im_start|>assistant\n")
    ends = [k for k in range(len(ids)) if mask[k] and (k + 1 == len(ids) or not mask[k + 1])]
    assert all(ids[k] == end for k in ends)


def test_demo_options_validation():
  for bad, match in [(dict(p_recover=1.2), "p_recover"), (dict(p_detour=-1), "p_detour"),
                     (dict(p_recover=0.6, p_detour=0.6), "p_recover \\+ p_detour"),
                     (dict(p_reorder=2), "p_reorder"),
                     (dict(answer_protocol="x"), "answer_protocol")]:
    with pytest.raises(ValueError, match=match):
      DemoOptions(**bad)


def _calls(demo):
  out = []
  for m in demo.messages:
    hit = m["role"] == "assistant" and STEP.fullmatch(m["content"])
    if hit:
      out += json.loads(hit.group(2))
  return out


def test_confused_demos_take_directions_at_random_and_follow_their_results(tasks):
  """`p_confuse=1`: every direction-bearing call takes a random direction (so about half the
  demos of such tasks end wrong, the rest of the demo executed faithfully); `p_confuse=0`
  leaves every demo as it was."""
  plain = make_demos(tasks, seed=0)
  confused = make_demos(tasks, seed=0, options=DemoOptions(p_confuse=1.0))
  assert make_demos(tasks, seed=0, options=DemoOptions(p_confuse=0.0))[5].messages == \
      plain[5].messages
  directed = [(t, d) for t, d in zip(tasks, confused)
              if t.metadata["down"] is None and any(
                  c["name"] in ("compare", "sort_list", "filter_list", "convert")
                  for c in t.metadata["plan"])]
  assert len(directed) > 50
  wrong = sum(d.answer != t.answer for t, d in directed)
  assert 0.3 < wrong / len(directed) < 0.7
  modes = collections.Counter(c["arguments"]["mode"] for _, d in directed for c in _calls(d)
                              if c["name"] == "compare")
  assert modes["max"] > 5 and modes["min"] > 5
  # Undirected tasks are untouched.
  for t, p, c in zip(tasks, plain, confused):
    if not any(x["name"] in ("compare", "sort_list", "filter_list", "convert")
               for x in t.metadata["plan"]):
      assert c.answer == p.answer
