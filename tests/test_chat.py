"""Qwen3 chat rendering: renderer vs the Jinja chat template, token-in/token-out pieces."""

import json
import re

import pytest
import transformers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, trainers

from tirjax.env import chat
from tirjax.env.tools import TERMINAL_TOOL, Tool
from tirjax.env.toolworld.demos import DemoOptions, make_demos
from tirjax.env.toolworld.tasks import make_tasks
from tirjax.env.toolworld.tokenizer import SPECIAL_TOKENS, TAG_TOKENS

QWEN_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@pytest.fixture(scope="module")
def qwen_like(tokenizer):
  """Qwen's pipeline (its regex), special tokens after the BPE vocabulary as in Qwen3, and no
  chat template: the helpers must not depend on our tokenizer's ids or template."""
  tok = Tokenizer(models.BPE())
  tok.normalizer = normalizers.NFC()
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(QWEN_REGEX), behavior="isolated", invert=False),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  texts = [chat.render_conversation(d.messages, d.tools) for d in make_demos(
      make_tasks("train", 40, seed=9))]
  tok.train_from_iterator(texts, trainers.BpeTrainer(
      vocab_size=600, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
                         + [AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
  return transformers.PreTrainedTokenizerFast(tokenizer_object=tok)


@pytest.fixture(scope="module")
def demos():
  tasks = make_tasks("train", 60, seed=1)
  return (make_demos(tasks, options=DemoOptions(p_recover=0.3, p_detour=0.2))
          + make_demos(tasks[:20], options=DemoOptions(answer_protocol="answer_tag")))


def test_template_equals_renderer_on_multi_step_demos(tokenizer, demos):
  multi = [d for d in demos if sum(m["role"] == "assistant" for m in d.messages) >= 3]
  assert len(multi) >= 10
  for d in demos:
    expected = chat.render_conversation(d.messages, d.tools)
    assert tokenizer.apply_chat_template(d.messages, tools=d.tools, tokenize=False) == expected
    prompt = tokenizer.apply_chat_template(d.messages[:2], tools=d.tools, tokenize=False,
                                           add_generation_prompt=True)
    assert prompt == chat.render_conversation(d.messages[:2], d.tools, add_generation_prompt=True)


def test_template_equals_renderer_on_other_shapes(tokenizer):
  tool = Tool("lookup", "Look up.", {"type": "object", "properties": {"q": {"type": "string"}}})
  shapes = [
      ([{"role": "user", "content": "hi"}], None),  # no system, no tools
      ([{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}], None),
      ([{"role": "user", "content": "hi"}], [tool.spec()]),  # tools without a system message
      ([{"role": "system", "content": "S"}, {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<think>a</think><tool_call>[]</tool_call>"},
        {"role": "tool", "content": "[1]"}, {"role": "tool", "content": "[2]"},
        {"role": "assistant", "content": "<think>b</think>done"},
        {"role": "system", "content": "late"}], [tool.spec()]),
  ]
  for messages, tools in shapes:
    for gen in (False, True):
      got = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                          add_generation_prompt=gen)
      assert got == chat.render_conversation(messages, tools or (), add_generation_prompt=gen)


def test_qwen3_layout():
  messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
              {"role": "assistant", "content": "<think>first</think><tool_call>[]</tool_call>"},
              {"role": "tool", "content": "R"},
              {"role": "assistant", "content": "<think>second</think><answer>A</answer>"}]
  spec = chat.RESPONSE_GEN.spec()
  text = chat.render_conversation(messages, [spec])
  assert text == (
      "<|im_start|>system\nS\n\n# Tools\n\nYou may call one or more functions to assist with the "
      "user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:"
      "\n<tools>\n" + json.dumps(spec) + "\n</tools>\n\nFor each function call, return a json "
      "object with function name and arguments within <tool_call></tool_call> XML tags:\n"
      "<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"
      "<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
      # earlier think blocks are kept verbatim (unlike Qwen3's official template)
      "<|im_start|>assistant\n<think>first</think><tool_call>[]</tool_call><|im_end|>\n"
      "<|im_start|>user\n<tool_response>\nR\n</tool_response><|im_end|>\n"
      "<|im_start|>assistant\n<think>second</think><answer>A</answer><|im_end|>\n")


def _episode_ids(tok, d):
  """The ids an episode runner builds: prompt, then sampled step ids + tool-response ids."""
  ids = chat.render_prompt_ids(tok, d.tools, d.messages[1]["content"],
                               "answer_tag" if "<answer>" in d.messages[-1]["content"]
                               else "response_gen")
  for m in d.messages[2:]:
    if m["role"] == "assistant":
      ids += chat.encode(tok, m["content"]) + [chat.im_end_id(tok)]
    else:
      ids += chat.render_tool_response_ids(tok, m["content"])
  return ids


@pytest.mark.parametrize("which", ["toolworld", "qwen_like"])
def test_token_in_token_out_pieces_equal_whole_text(which, request, demos):
  tok = request.getfixturevalue("tokenizer" if which == "toolworld" else which)
  for d in demos:
    text = chat.render_conversation(d.messages, d.tools)
    whole = chat.encode(tok, text)
    episode = _episode_ids(tok, d)
    assert episode + chat.encode(tok, "\n") == whole
    ids, mask = chat.encode_conversation(tok, d.messages, d.tools)
    assert ids == whole and len(mask) == len(ids)
    assert tok.decode(ids) == text


@pytest.mark.parametrize("which", ["toolworld", "qwen_like"])
def test_loss_mask_covers_exactly_the_assistant_turns(which, request, demos):
  tok = request.getfixturevalue("tokenizer" if which == "toolworld" else which)
  end = chat.im_end_id(tok)
  for d in demos:
    ids, mask = chat.encode_conversation(tok, d.messages, d.tools)
    runs, current = [], []
    for i, m in zip(ids, mask):
      if m:
        current.append(i)
      elif current:
        runs.append(current)
        current = []
    runs += [current] if current else []
    contents = [m["content"] for m in d.messages
                if m["role"] == "assistant" and m.get("train", True)]
    assert [tok.decode(r) for r in runs] == [c + "<|im_end|>" for c in contents]
    assert all(r[-1] == end for r in runs)
    # Everything unmasked is template, system, user and tool text.
    assert sum(mask) == sum(len(chat.encode(tok, c)) + 1 for c in contents)


def test_prompt_ids_equal_template_with_generation_prompt(tokenizer):
  task = make_tasks("eval", 1, seed=2)[0]
  for protocol in chat.ANSWER_PROTOCOLS:
    ids = chat.render_prompt_ids(tokenizer, task, task.question, protocol)
    text = tokenizer.apply_chat_template(
        chat.prompt_messages(task.question, protocol), tools=chat.tool_specs(task.tools, protocol),
        tokenize=False, add_generation_prompt=True)
    assert ids == chat.encode(tokenizer, text)
    assert text.endswith("<|im_start|>user\n" + task.question + "<|im_end|>\n"
                         "<|im_start|>assistant\n")


def test_tool_response_ids_layout(tokenizer):
  ids = chat.render_tool_response_ids(tokenizer, '[{"name": "x", "result": 1}]')
  assert tokenizer.decode(ids) == ("\n<|im_start|>user\n<tool_response>\n"
                                   '[{"name": "x", "result": 1}]\n</tool_response><|im_end|>\n'
                                   "<|im_start|>assistant\n")
  assert set(chat.stop_token_ids(tokenizer)) == {tokenizer.convert_tokens_to_ids("<|im_end|>"),
                                                 tokenizer.convert_tokens_to_ids("<|endoftext|>")}


def test_tool_specs_per_protocol():
  plain = Tool("a", "A.", {"type": "object", "properties": {}})
  def names(specs):
    return [s["function"]["name"] for s in specs]

  assert names(chat.tool_specs([plain], "response_gen")) == ["a", TERMINAL_TOOL]
  assert names(chat.tool_specs([chat.RESPONSE_GEN, plain], "response_gen")) == ["a", TERMINAL_TOOL]
  assert names(chat.tool_specs([chat.RESPONSE_GEN, plain], "answer_tag")) == ["a"]
  with pytest.raises(ValueError, match="answer_protocol"):
    chat.tool_specs([plain], "tags")


def test_step_formats():
  calls = [{"name": "f", "arguments": {"x": "é", "n": 2}}, {"name": "g", "arguments": {}}]
  step = chat.format_step("why", calls)
  m = re.fullmatch(r"<think>(.*)</think><tool_call>(.*)</tool_call>", step, re.S)
  assert m.group(1) == "why" and json.loads(m.group(2)) == calls and "é" in step
  final = chat.format_answer_step("done", "42")
  assert json.loads(re.search(r"<tool_call>(.*)</tool_call>", final).group(1)) == [
      {"name": TERMINAL_TOOL, "arguments": {"answer": "42"}}]
  assert chat.format_answer_step("done", "42", "answer_tag") == (
      "<think>done</think><answer>42</answer>")
  entries = [{"name": "f", "result": "Zoë"}, {"name": "g", "error": "bad"}]
  assert json.loads(chat.tool_response_content(entries)) == entries
  assert "Zoë" in chat.tool_response_content(entries)


def test_renderer_rejects_bad_messages():
  with pytest.raises(ValueError, match="unknown role"):
    chat.render_conversation([{"role": "robot", "content": "x"}])
  with pytest.raises(ValueError, match="string content"):
    chat.render_conversation([{"role": "user", "content": None}])
  with pytest.raises(ValueError, match="at least one"):
    chat.render_conversation([])
