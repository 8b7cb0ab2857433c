"""Tools and tasks: what an episode acts on (spec §6).

A tool is a name, a JSON schema for its arguments and a Python callable. A task is one query
with its tools, its reference answer and its ground-truth calls. Both are plain data so that
datasets (toolworld, ToolHop, FTRL, BFCL) can produce them and the episode runner can consume
them without knowing where they came from.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Literal, Mapping, Optional, Protocol, Sequence, get_args


def is_call_name(name: Any) -> bool:
  """Whether `name` may name a tool or an argument in a call: an ASCII identifier. A
  verdict's checker may `eval` call strings built of these names (BFCL's), and Python folds
  a non-ASCII identifier to its NFKC form there (a fullwidth `ｘ` is `x`), while the live
  call passes the name as it is (`fn(**{"ｘ": 1})` fails): refusing non-ASCII names in the
  parser keeps the run and its verdict on the same calls (issue 56)."""
  return isinstance(name, str) and name.isascii() and name.isidentifier()

TERMINAL_TOOL = "response_gen"
UNABLE_TO_ANSWER = "unable_to_answer"
AnswerProtocol = Literal["response_gen", "answer_tag"]
ANSWER_PROTOCOLS = get_args(AnswerProtocol)


class ToolError(Exception):
  """Raised by a tool to report an explicit error message back to the agent."""


@dataclasses.dataclass(frozen=True)
class Tool:
  name: str
  description: str
  parameters: Mapping[str, Any]  # a JSON schema of type "object"
  fn: Optional[Callable[..., Any]] = None  # called with **arguments; None: runs elsewhere

  def spec(self) -> dict:
    """The OpenAI-style function description shown to the model in the system prompt."""
    return {"type": "function", "function": {
        "name": self.name, "description": self.description, "parameters": dict(self.parameters)}}


RESPONSE_GEN = Tool(
    name=TERMINAL_TOOL,
    description="Give the final answer to the user and end the episode. Answer "
                f"'{UNABLE_TO_ANSWER}' if the tools cannot answer the question.",
    parameters={"type": "object", "properties": {"answer": {
        "type": "string", "description": "The final answer."}},
        "required": ["answer"], "additionalProperties": False})


class ToolSession(Protocol):
  """Per-episode tool state (e.g. a BFCL file system): opened by `Task.session` per episode."""

  def call(self, name: str, arguments: Mapping[str, Any]) -> Any:
    """Runs tool `name`; raises `ToolError` (or any exception) on failure."""
    ...

  def close(self) -> None:
    ...


@dataclasses.dataclass(frozen=True)
class Dialogue:
  """A task whose user speaks several times (BFCL multi-turn, spec §6.1).

  The task's `question` is the first user turn; `user_turns` are the later ones, in order. Within
  a turn the agent takes steps; a step without a tool call (a plain message, or the protocol's
  answer) ends the turn, and the next user turn follows in the same context; after the last turn
  the episode ends. More than `max_steps_per_turn` steps with calls in one turn end the episode
  unsuccessfully (the benchmark's force-quit).
  """

  user_turns: Sequence[str]
  max_steps_per_turn: int
  # A step's calls [{"name", "arguments"}] as the benchmark's checker takes them.
  decode: Callable[[Sequence[Mapping[str, Any]]], list]
  # Success of a finished episode from its calls, per turn, per step (decoded): the
  # benchmark's own checker.
  score: Callable[[list], bool]
  # The user turn (0-based) of each ground-truth call, in `Task.flat_gt_calls` order: a
  # predicted call is matched only against the ground truth of its own turn.
  gt_call_turns: Sequence[int] = ()
  # Tools added to the agent's at a turn (BFCL's held-back functions), by turn index.
  turn_tools: Mapping[int, Sequence["Tool"]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Task:
  """One query. `gt_calls[s]` are the ground-truth calls of step s (independent calls)."""

  task_id: str
  question: str
  tools: Sequence[Tool]
  answer: Optional[str]  # reference answer; UNABLE_TO_ANSWER when the tools cannot answer
  gt_calls: Sequence[Sequence[dict]] = ()  # [[{"name", "arguments"}, ...], ...] per step
  expected: Optional[Mapping[str, Sequence[str]]] = None  # FTRL: tool → expected outputs
  metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  # Opens fresh per-episode tool state; None: each tool's `fn` is called directly.
  session: Optional[Callable[[], ToolSession]] = None
  dialogue: Optional[Dialogue] = None  # several user turns (BFCL multi-turn)
  # Tool name -> its parameters that hold a direction (toolworld: compare's mode, ...), for
  # `rollout.strict_directions`; None: its environment names none.
  direction_params: Optional[Mapping[str, Sequence[str]]] = None

  @property
  def flat_gt_calls(self) -> list[dict]:
    return [c for step in self.gt_calls for c in step]


def agent_tools(task: Task, answer_protocol: str = "response_gen") -> list[Tool]:
  """The tools the agent sees: the task's, plus `response_gen` under that protocol."""
  if answer_protocol not in ANSWER_PROTOCOLS:
    raise ValueError(f"answer_protocol: must be one of {ANSWER_PROTOCOLS}, got "
                     f"{answer_protocol!r}")
  tools = [t for t in task.tools if t.name != TERMINAL_TOOL]
  return tools + [RESPONSE_GEN] if answer_protocol == "response_gen" else tools
