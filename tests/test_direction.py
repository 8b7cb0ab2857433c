"""The direction probe (issue 26): flipped calls, the demonstrated and flipped step of each task,
and P(right) against a loop over the conversations with the dense log-probs."""

import json
import random

import jax
import numpy as np
import pytest

from tirjax.env import chat
from tirjax.env.toolworld import Difficulty, make_tasks
from tirjax.env.toolworld.demos import DemoOptions, direction_steps, flip, make_demo
from tirjax.env.toolworld.queries import DIRECTION_TOOLS, TEMPLATES
from tirjax.env.toolworld.direction import direction_preference
from tirjax.models import config, decoder
from tirjax.testing.reference.model_logprobs import dense_logprobs

CALLS = [
    ({"name": "compare", "arguments": {"items": {"A": 1, "B": 2}, "mode": "max"}}, "mode", "min"),
    ({"name": "sort_list", "arguments": {"items": {"A": 1}, "order": "asc"}}, "order", "desc"),
    ({"name": "filter_list", "arguments": {"items": {"A": 1}, "op": "gt", "value": 3}}, "op",
     "lt"),
]


@pytest.mark.parametrize("call, key, flipped", CALLS)
def test_flip_changes_the_direction_only(call, key, flipped):
  out = flip(call)
  assert out["arguments"][key] == flipped
  assert {k: v for k, v in out["arguments"].items() if k != key} == {
      k: v for k, v in call["arguments"].items() if k != key}
  assert flip(out) == call


def test_flip_of_convert_and_of_other_calls():
  convert = {"name": "convert", "arguments": {"value": 3, "from_unit": "km", "to_unit": "mi"}}
  assert flip(convert)["arguments"] == {"value": 3, "from_unit": "mi", "to_unit": "km"}
  look = {"name": "city_info", "arguments": {"name": "Bazol", "field": "population"}}
  assert flip(look) is look


def test_direction_steps_follow_the_demonstration():
  tasks = make_tasks("train", 80, seed=3, difficulty=Difficulty(p_down=0.3))
  seen = 0
  for task in tasks:
    pair = direction_steps(task, "answer_tag")
    down = task.metadata["down"]
    if not TEMPLATES[task.metadata["template"]].direction:
      assert pair is None
      continue
    if pair is None:  # a down tool ends the demonstration before its direction
      assert down is not None
      continue
    seen += 1
    context, tools, right, wrong = pair
    demo = make_demo(task, random.Random(0), DemoOptions(
        p_recover=0, p_detour=0, p_reorder=0, answer_protocol="answer_tag"))
    assert demo.messages[:len(context) + 1] == context + [{"role": "assistant",
                                                          "content": right}]
    assert context[-1]["role"] in ("user", "tool") and tools == demo.tools
    body = lambda s: json.loads(s[s.index("<tool_call>") + 11:s.rindex("</tool_call>")])
    assert any(c["name"] in DIRECTION_TOOLS for c in body(right))
    assert body(wrong) == [flip(c) for c in body(right)] != body(right)
    assert "<think>" in wrong and wrong != right
  assert seen > 10


def test_direction_preference_matches_a_loop_with_dense_logprobs(tokenizer):
  model = decoder.init(config.tiny(vocab_size=len(tokenizer), init_std=0.5), seed=1)
  tasks = make_tasks("eval", 12, seed=0, difficulty=Difficulty(p_direction=1.0, p_down=0.0))
  got = direction_preference(model, tokenizer, tasks, "answer_tag", rows=4)
  # The dense forward pass of one conversation, unpadded (jitted as a whole: op by op, each of
  # the 14 lengths compiled every operation again).
  dense = jax.jit(lambda tokens, valid: dense_logprobs(model.hidden(tokens, valid),
                                                       model.unembedding, tokens, valid)[0])
  want = []
  for task in tasks:
    context, tools, right, wrong = direction_steps(task, "answer_tag")
    start = len(chat.encode_conversation(tokenizer, context, tools)[0])
    scores = []
    for step in (right, wrong):
      ids, mask = chat.encode_conversation(
          tokenizer, context + [{"role": "assistant", "content": step}], tools)
      tokens = np.asarray([ids], np.int32)
      valid = np.ones_like(tokens, bool)
      lp = dense(tokens, valid)
      scores.append(sum(float(lp[0, k]) for k in range(start, len(ids)) if mask[k]))
    want.append(np.exp(scores[0]) / (np.exp(scores[0]) + np.exp(scores[1])))
  assert got["eval/direction_tasks"] == len(tasks)
  np.testing.assert_allclose(got["eval/direction_p_right"], np.mean(want), rtol=1e-4)
  assert 0.0 < got["eval/direction_p_right"] < 1.0
  assert direction_preference(model, tokenizer, make_tasks(
      "eval", 4, difficulty=Difficulty(hop_weights=(1, 0, 0, 0), p_down=1.0)), "answer_tag") == {}
