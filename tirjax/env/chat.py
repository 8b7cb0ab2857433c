"""Qwen3 chat rendering, and the token-in/token-out pieces of an episode (spec §6, §7).

The text layout is Qwen3's: `<|im_start|>role\\n…<|im_end|>\\n` turns; with tools, the system
turn holds the optional system text, then Qwen3's tool preamble with one JSON tool spec per line
inside `<tools></tools>`; tool responses are a user turn of
`<tool_response>\\n…\\n</tool_response>` blocks (consecutive tool messages share one user turn).

One deliberate departure from Qwen3's official template: it strips the `<think>` content of
assistant turns before the last user query and re-formats the rest. Training here is
token-in/token-out over whole trajectories, so an assistant turn is rendered verbatim
(`<|im_start|>assistant\\n` + content + `<|im_end|>\\n`), exactly the tokens the policy sampled.
`CHAT_TEMPLATE` is the Jinja form of `render_conversation`; the toolworld tokenizer ships it.

Our step format differs from the one-object-per-block format that Qwen3's preamble describes
(kept word for word): a step is `<think>…</think><tool_call>[…]</tool_call>` with a JSON *array*
of independent calls. The system text (`SYSTEM_PROMPTS`) states that protocol.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence, Union

from tirjax.env.tools import TERMINAL_TOOL, Task, Tool

ANSWER_PROTOCOLS = ("response_gen", "answer_tag")
IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"

SYSTEM_PROMPTS = {
    "response_gen": (
        "Answer the question with the tools. In each step, think briefly in <think></think>, "
        "then write <tool_call></tool_call> holding a JSON array of calls; calls in one array "
        "run in parallel. Finish by calling response_gen with the answer. If a tool you need "
        "is unavailable, answer unable_to_answer."),
    "answer_tag": (
        "Answer the question with the tools. In each step, think briefly in <think></think>, "
        "then write <tool_call></tool_call> holding a JSON array of calls; calls in one array "
        "run in parallel. Finish with <answer></answer> holding the answer. If a tool you need "
        "is unavailable, answer unable_to_answer."),
}

RESPONSE_GEN = Tool(
    name=TERMINAL_TOOL,
    description="Give the final answer and stop.",
    parameters={"type": "object", "properties": {"answer": {"type": "string"}},
                "required": ["answer"], "additionalProperties": False},
    fn=lambda answer: answer)

# Qwen3's tool preamble, word for word.
_TOOLS_HEAD = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
               "You are provided with function signatures within <tools></tools> XML tags:\n"
               "<tools>")
_TOOLS_TAIL = ("\n</tools>\n\nFor each function call, return a json object with function name "
               "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
               "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"
               "<|im_end|>\n")

CHAT_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0].role == 'system' %}\n"
    "        {{- messages[0].content + '\\n\\n' }}\n"
    "    {%- endif %}\n"
    "    {{- " + json.dumps(_TOOLS_HEAD) + " }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- '\\n' }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- " + json.dumps(_TOOLS_TAIL) + " }}\n"
    "{%- else %}\n"
    "    {%- if messages[0].role == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if message.content is not string %}\n"
    "        {{- raise_exception('every message needs a string content') }}\n"
    "    {%- endif %}\n"
    "    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == 'assistant' %}\n"
    "        {#- verbatim: earlier <think> blocks are kept (token-in/token-out training) #}\n"
    "        {{- '<|im_start|>assistant\\n' + message.content + '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == 'tool' %}\n"
    "        {%- if loop.first or (messages[loop.index0 - 1].role != 'tool') %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- elif not (message.role == 'system' and loop.first) %}\n"
    "        {{- raise_exception('unknown role: ' + message.role) }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n")

ToolLike = Union[Tool, Mapping[str, Any]]


def _check_protocol(answer_protocol: str):
  if answer_protocol not in ANSWER_PROTOCOLS:
    raise ValueError(f"answer_protocol: must be one of {ANSWER_PROTOCOLS}, got {answer_protocol!r}")


def _spec(tool: ToolLike) -> dict:
  return tool.spec() if isinstance(tool, Tool) else dict(tool)


def _name(tool: ToolLike) -> str:
  return tool.name if isinstance(tool, Tool) else tool["function"]["name"]


def tool_specs(tools: Sequence[ToolLike], answer_protocol: str = "response_gen") -> list[dict]:
  """The specs listed in the system prompt: `response_gen` last, or absent with `answer_tag`."""
  _check_protocol(answer_protocol)
  specs = [_spec(t) for t in tools if _name(t) != TERMINAL_TOOL]
  if answer_protocol == "response_gen":
    terminal = [t for t in tools if _name(t) == TERMINAL_TOOL]
    specs.append(_spec(terminal[0] if terminal else RESPONSE_GEN))
  return specs


def prompt_messages(question: str, answer_protocol: str = "response_gen") -> list[dict]:
  """The system and user messages that open every episode."""
  _check_protocol(answer_protocol)
  return [{"role": "system", "content": SYSTEM_PROMPTS[answer_protocol]},
          {"role": "user", "content": question}]


def format_step(think: str, calls: Sequence[Mapping[str, Any]]) -> str:
  """An assistant step: `<think>…</think><tool_call>[{"name", "arguments"}, …]</tool_call>`."""
  body = json.dumps([{"name": c["name"], "arguments": c["arguments"]} for c in calls],
                    ensure_ascii=False)
  return f"<think>{think}</think><tool_call>{body}</tool_call>"


def format_answer_step(think: str, answer: str, answer_protocol: str = "response_gen") -> str:
  """The final step: a `response_gen` call, or `<answer>…</answer>` (HiDiffTIR's protocol)."""
  _check_protocol(answer_protocol)
  if answer_protocol == "answer_tag":
    return f"<think>{think}</think><answer>{answer}</answer>"
  return format_step(think, [{"name": TERMINAL_TOOL, "arguments": {"answer": answer}}])


def tool_response_content(entries: Sequence[Mapping[str, Any]]) -> str:
  """The tool message: JSON of `[{"name", "result"} | {"name", "error"}, …]`, one per call."""
  return json.dumps(list(entries), ensure_ascii=False)


def render_conversation(messages: Sequence[Mapping[str, str]], tools: Sequence[ToolLike] = (),
                        add_generation_prompt: bool = False) -> str:
  """The text of a whole conversation; `CHAT_TEMPLATE` renders the same text."""
  if not messages:
    raise ValueError("messages: need at least one message")
  for m in messages:
    if not isinstance(m.get("content"), str):
      raise ValueError(f"messages: every message needs a string content, got {m!r}")
  out = []
  if tools:
    out.append(f"{IM_START}system\n")
    if messages[0]["role"] == "system":
      out.append(messages[0]["content"] + "\n\n")
    out.append(_TOOLS_HEAD)
    out.extend("\n" + json.dumps(_spec(t), ensure_ascii=False) for t in tools)
    out.append(_TOOLS_TAIL)
  elif messages[0]["role"] == "system":
    out.append(f"{IM_START}system\n{messages[0]['content']}{IM_END}\n")
  last = len(messages) - 1
  for i, m in enumerate(messages):
    role, content = m["role"], m["content"]
    if role == "user" or (role == "system" and i > 0):
      out.append(f"{IM_START}{role}\n{content}{IM_END}\n")
    elif role == "assistant":
      out.append(f"{IM_START}assistant\n{content}{IM_END}\n")
    elif role == "tool":
      if i == 0 or messages[i - 1]["role"] != "tool":
        out.append(f"{IM_START}user")
      out.append(f"\n<tool_response>\n{content}\n</tool_response>")
      if i == last or messages[i + 1]["role"] != "tool":
        out.append(f"{IM_END}\n")
    elif role != "system":
      raise ValueError(f"messages: unknown role {role!r}")
  if add_generation_prompt:
    out.append(f"{IM_START}assistant\n")
  return "".join(out)


def encode(tokenizer, text: str) -> list[int]:
  """Token ids of `text`, special tokens recognised, nothing added (works for any HF tokenizer)."""
  return list(tokenizer.encode(text, add_special_tokens=False))


def im_end_id(tokenizer) -> int:
  token_id = tokenizer.convert_tokens_to_ids(IM_END)
  if token_id is None or token_id == tokenizer.unk_token_id:
    raise ValueError(f"tokenizer: {IM_END} is not a token of this tokenizer")
  return token_id


def stop_token_ids(tokenizer) -> tuple[int, ...]:
  """The ids that end an assistant turn: `<|im_end|>` and `<|endoftext|>`."""
  return (im_end_id(tokenizer), tokenizer.convert_tokens_to_ids(END_OF_TEXT))


def render_prompt_ids(tokenizer, task_or_tools: Union[Task, Sequence[ToolLike]], question: str,
                      answer_protocol: str = "response_gen") -> list[int]:
  """System + user turn + `<|im_start|>assistant\\n`: the ids an episode starts from."""
  tools = task_or_tools.tools if isinstance(task_or_tools, Task) else task_or_tools
  text = render_conversation(prompt_messages(question, answer_protocol),
                             tool_specs(tools, answer_protocol), add_generation_prompt=True)
  return encode(tokenizer, text)


def render_tool_response_ids(tokenizer, content: str) -> list[int]:
  """The ids appended after an assistant step's `<|im_end|>`: tool turn + next generation prompt."""
  return encode(tokenizer, f"\n{IM_START}user\n<tool_response>\n{content}\n</tool_response>"
                           f"{IM_END}\n{IM_START}assistant\n")


def render_user_turn_ids(tokenizer, content: str) -> list[int]:
  """The ids appended after an assistant step that ended a turn of a dialogue: the user's next
  message + the next generation prompt."""
  return encode(tokenizer, f"\n{IM_START}user\n{content}{IM_END}\n{IM_START}assistant\n")


def encode_conversation(tokenizer, messages: Sequence[Mapping[str, str]],
                        tools: Sequence[ToolLike] = ()) -> tuple[list[int], list[int]]:
  """Token ids of `render_conversation(messages, tools)` and the SFT loss mask.

  Built piece by piece as an episode builds them: the mask is 1 on each assistant turn's content
  and its `<|im_end|>`, 0 on everything else (system, user, tool turns, role headers, newlines)
  and on assistant turns marked `"train": False` (context to learn from, not to imitate).
  """
  ids: list[int] = []
  mask: list[int] = []
  end = im_end_id(tokenizer)
  rendered = ""
  for i, m in enumerate(messages):
    if m["role"] != "assistant":
      continue
    prefix = render_conversation(messages[:i], tools, add_generation_prompt=True)
    glue = encode(tokenizer, prefix[len(rendered):])
    own = encode(tokenizer, m["content"]) + [end]
    ids += glue + own
    mask += [0] * len(glue) + [int(m.get("train", True))] * len(own)
    rendered = prefix + m["content"] + IM_END
  rest = encode(tokenizer, render_conversation(messages, tools)[len(rendered):])
  return ids + rest, mask + [0] * len(rest)
