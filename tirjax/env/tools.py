"""Tools and tasks: what an episode acts on (SPEC §6).

A tool is a name, a JSON schema for its arguments and a Python callable. A task is one query
with its tools, its reference answer and its ground-truth calls. Both are plain data so that
datasets (toolworld, ToolHop, FTRL, BFCL) can produce them and the episode runner can consume
them without knowing where they came from.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence

TERMINAL_TOOL = "response_gen"
UNABLE_TO_ANSWER = "unable_to_answer"


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

  @property
  def flat_gt_calls(self) -> list[dict]:
    return [c for step in self.gt_calls for c in step]
