"""The tool environment of one episode: parse a step, run its calls, report (spec §6).

`ToolEnv(task, options).step(text)` parses the assistant step (checks 1-4, `parser.py`), runs
its independent calls in order, each call's failure isolated (check 5), and returns a
`StepResult` with the tool-response message content::

    [{"name": str, "result": <JSON>} | {"name": str, "error": str}, ...]   one per call
    [{"error": str}]                                                       unparseable step

A valid `response_gen` call (or, under the answer_tag protocol, an `<answer>` block) ends the
episode with its answer; reaching `max_steps` (T_max) ends it unanswered. Nothing the agent
writes makes `step` raise; calling it after the episode ended is a bug of the caller and does.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal, Optional, get_args

from tirjax import option_checks
from tirjax.env import verify
from tirjax.env._sandbox_wire import held_to  # one rule for every text held to a limit
from tirjax.env.parser import NUM_CHECKS, ParseLimits, StepParser, format_reward
from tirjax.env.tools import ANSWER_PROTOCOLS, TERMINAL_TOOL, Task, ToolError, agent_tools

TERMINAL_RESULT = "answer received"


SolveScoring = Literal["ftrl", "strict"]
SOLVE_SCORING = get_args(SolveScoring)


@dataclasses.dataclass(frozen=True)
class ToolEnvOptions:
  max_steps: int = 6  # T_max
  answer_protocol: str = "response_gen"
  limits: ParseLimits = ParseLimits()
  # A returned JSON object with a non-empty "error" key (the convention of the FTRL, ToolHop
  # and BFCL tool code) fails check 5; the object is still returned to the agent as the result.
  error_results: bool = True
  # Longer tool outputs are replaced by an error; longer error messages (the tool's, the
  # sandbox's, the parser's) are cut to it.
  max_output_chars: int = 100_000
  # Tasks scored by Solve-P/R/F1 (they carry expected answers, FTRL's): "ftrl" executes a call
  # of a known tool whose arguments violate its schema, as bytedance/FTRL's scorer does (it
  # calls the tool's Python function with the arguments as given; a missing or extra argument
  # then fails there, as a TypeError); "strict" refuses it with the schema error. Either way
  # the violation fails format check 4. Tasks without expected answers always refuse it.
  solve_scoring: str = "ftrl"

  def __post_init__(self):
    option_checks.at_least("max_steps", self.max_steps, 1)
    option_checks.one_of("answer_protocol", self.answer_protocol, ANSWER_PROTOCOLS)
    option_checks.at_least("max_output_chars", self.max_output_chars, 1)
    option_checks.one_of("solve_scoring", self.solve_scoring, SOLVE_SCORING)


@dataclasses.dataclass
class StepResult:
  think: Optional[str]
  calls: list  # parsed calls {"name", "arguments"}, terminal calls excluded (what call_sim sees)
  call_results: list  # per kept call: {"name", "result"} or {"name", "error"}
  response_content: str  # the tool-response message text (every call, terminal included)
  checks_passed: int  # 0..5
  format_reward: float  # R_fm
  done: bool
  answer: Optional[str]
  answered: bool
  call_solves: list  # per kept call: its output verified a still-unsolved expected answer
  error: Optional[str]  # why the first failed check failed; None if all passed
  # Dialogue tasks (`Task.dialogue`): the user turn the step belongs to; the next user turn's
  # message when this step ended a turn (sent instead of a tool response); on the final step,
  # success by the benchmark's checker.
  turn: int = 0
  user_message: Optional[str] = None
  success: Optional[bool] = None


@dataclasses.dataclass(frozen=True)
class EpisodeSummary:
  """What the metrics need from one finished (or truncated) episode."""

  task_id: str
  num_steps: int
  answered: bool
  answer: Optional[str]
  format_rewards: tuple  # R_fm per step
  num_calls: int  # kept calls generated (terminal calls excluded)
  num_solved: int  # FTRL: expected answers verified by call outputs
  num_expected: int  # FTRL: size of the expected-answer set


class ToolEnv:
  """One episode of `task`. Pass `parser` to share one `StepParser` across a task's episodes."""

  def __init__(self, task: Task, options: ToolEnvOptions = ToolEnvOptions(),
               parser: Optional[StepParser] = None):
    self.task = task
    self.options = options
    self.parser = parser or StepParser(agent_tools(task, options.answer_protocol),
                                       options.answer_protocol, options.limits)
    if parser is not None and parser.answer_protocol != options.answer_protocol:
      raise ValueError("parser: its answer_protocol differs from options.answer_protocol")
    self._tools = {t.name: t for t in task.tools}
    self._session = task.session() if task.session is not None else None
    self._unsolved = {k: list(v) for k, v in (task.expected or {}).items()}
    self.steps: list[StepResult] = []
    self.transcript: list[tuple[str, str]] = []  # (step text, tool-response content)
    self.done = False
    self.answered = False
    self.answer: Optional[str] = None
    # Dialogue tasks: the decoded calls of each turn's steps, the current turn's step count.
    self.turn_calls: list[list[list]] = [[]]
    self._turn_steps = 0

  def step(self, text: str) -> StepResult:
    if self.done:
      raise RuntimeError(f"task {self.task.task_id}: step() after the episode ended")
    if self.task.dialogue is not None:
      return self._dialogue_step(text)
    parsed = self.parser.parse(text)
    entries: list[dict] = []
    kept, kept_results, solves = [], [], []
    answer = parsed.answer
    executed_ok = True
    if parsed.checks_passed < 3:
      entries.append({"error": self._held(parsed.error)})
    for call, error in zip(parsed.calls, parsed.call_errors):
      name = call["name"]
      terminal = name == TERMINAL_TOOL and self.options.answer_protocol == "response_gen"
      if error is None and terminal:
        if answer is None:
          answer = call["arguments"]["answer"]
          entry = {"name": name, "result": TERMINAL_RESULT}
        else:
          entry = {"name": name, "error": f"{TERMINAL_TOOL} was already called in this step"}
      elif error is None or self._run_despite_schema(name):
        entry = self._execute(name, call["arguments"])
      else:
        entry = {"name": name, "error": self._held(error)}
      executed_ok &= self._succeeded(entry)
      entries.append(entry)
      if not terminal:
        kept.append(call)
        kept_results.append(entry)
        solves.append(self._solves(entry))
    passed = NUM_CHECKS if parsed.checks_passed == 4 and executed_ok else parsed.checks_passed
    answered = answer is not None
    self.answered, self.answer = answered, answer
    self.done = answered or len(self.steps) + 1 >= self.options.max_steps
    content = json.dumps(entries, ensure_ascii=False)
    # An unpaired surrogate in a tool output becomes the JSON escape \udXXX: still valid JSON,
    # and encodable as UTF-8 for the tokenizer.
    content = content.encode("utf-8", "backslashreplace").decode("utf-8")
    first_error = parsed.error or next((e["error"] for e in entries if "error" in e), None)
    if first_error is None and passed < NUM_CHECKS:
      first_error = "a tool returned an error object"
    result = StepResult(
        think=parsed.think, calls=kept, call_results=kept_results, response_content=content,
        checks_passed=passed, format_reward=format_reward(passed), done=self.done,
        answer=answer, answered=answered, call_solves=solves,
        error=None if passed == NUM_CHECKS else first_error)
    self.steps.append(result)
    self.transcript.append((text, content))
    if self.done:
      self.close()
    return result

  def _dialogue_step(self, text: str) -> StepResult:
    """A step of a multi-turn dialogue, as bfcl-eval's inference loop takes it: a step whose
    calls decode is run (every call, schema violations and unknown names included: the
    benchmark executes what decodes) and the turn goes on; a step without calls (a plain
    message, the protocol's answer, or calls that do not decode) ends the turn."""
    d = self.task.dialogue
    parsed = self.parser.parse(text)
    calls = [c for c in parsed.calls if not (
        c["name"] == TERMINAL_TOOL and self.options.answer_protocol == "response_gen")]
    turn = len(self.turn_calls) - 1
    entries, user_message, success = [], None, None
    if calls:
      entries = [self._execute(c["name"], c["arguments"]) for c in calls]
      self.turn_calls[-1].append(d.decode(calls))
      self._turn_steps += 1
      force_quit = self._turn_steps > d.max_steps_per_turn
      out_of_steps = len(self.steps) + 1 >= self.options.max_steps
      self.done = force_quit or out_of_steps
      if self.done:
        success = False  # bfcl-eval fails an entry that did not reach its last turn's end
    elif turn < len(d.user_turns):
      user_message = d.user_turns[turn]
      self.turn_calls.append([])
      self._turn_steps = 0
      added = d.turn_tools.get(turn + 1, ())
      if added:
        self.parser = StepParser([*self.parser.tools.values(), *added],
                                 self.options.answer_protocol, self.options.limits)
      self.done = len(self.steps) + 1 >= self.options.max_steps
      success = False if self.done else None
    else:
      self.done = self.answered = True
      success = bool(d.score(self.turn_calls))
    passed = parsed.checks_passed
    if calls and passed == 4 and all(self._succeeded(e) for e in entries):
      passed = NUM_CHECKS
    content = user_message if user_message is not None else json.dumps(entries,
                                                                        ensure_ascii=False)
    content = content.encode("utf-8", "backslashreplace").decode("utf-8")
    error = parsed.error or next((e["error"] for e in entries if "error" in e), None)
    result = StepResult(
        think=parsed.think, calls=calls, call_results=entries, response_content=content,
        checks_passed=passed, format_reward=format_reward(passed), done=self.done,
        answer=None, answered=self.answered, call_solves=[False] * len(calls),
        error=None if passed == NUM_CHECKS else error, turn=turn, user_message=user_message,
        success=success)
    self.steps.append(result)
    self.transcript.append((text, content))
    if self.done:
      self.close()
    return result

  def summary(self) -> EpisodeSummary:
    return EpisodeSummary(
        task_id=self.task.task_id, num_steps=len(self.steps), answered=self.answered,
        answer=self.answer, format_rewards=tuple(s.format_reward for s in self.steps),
        num_calls=sum(len(s.calls) for s in self.steps),
        num_solved=sum(sum(s.call_solves) for s in self.steps),
        num_expected=sum(len(v) for v in (self.task.expected or {}).values()))

  def close(self) -> None:
    """Releases per-episode tool state (idempotent)."""
    session, self._session = self._session, None
    if session is not None:
      session.close()

  def __enter__(self) -> "ToolEnv":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  # -- internals --------------------------------------------------------------------------

  def _execute(self, name: str, arguments: dict) -> dict:
    try:
      if self.task.session is not None:
        if self._session is None:
          raise ToolError("the episode's tool session is closed")
        value = self._session.call(name, arguments)
      else:
        fn = self._tools[name].fn
        if fn is None:
          raise ToolError(f"tool {name!r} has no implementation here")
        value = fn(**arguments)
      value = _as_json(value)
      size = len(json.dumps(value, ensure_ascii=False))
      if size > self.options.max_output_chars:
        raise ToolError(f"tool output too large: {size} characters (limit "
                        f"{self.options.max_output_chars})")
      return {"name": name, "result": value}
    except ToolError as e:
      return {"name": name, "error": self._held(str(e))}
    except Exception as e:  # noqa: BLE001 - a tool's failure is reported to the agent
      return {"name": name, "error": self._held(f"{type(e).__name__}: {e}")}

  def _held(self, error: str) -> str:
    """An error message held to `max_output_chars`, like a tool's output: its tokens go into
    the context just the same."""
    return held_to(error, self.options.max_output_chars)

  def _run_despite_schema(self, name: str) -> bool:
    """FTRL's scoring: a call of a known tool with schema-violating arguments is still run."""
    return (self.options.solve_scoring == "ftrl" and bool(self.task.expected)
            and name in self._tools and name != TERMINAL_TOOL)

  def _succeeded(self, entry: dict) -> bool:
    if "error" in entry:
      return False
    value = entry["result"]
    return not (self.options.error_results and isinstance(value, dict) and value.get("error"))

  def _solves(self, entry: dict) -> bool:
    """FTRL: the output verifies one still-unsolved expected answer of this tool (removed)."""
    if "error" in entry:
      return False
    candidates = self._unsolved.get(entry["name"], [])
    for i, expected in enumerate(candidates):
      if verify.contains_answer(entry["result"], expected):
        del candidates[i]
        return True
    return False


def _as_json(value: Any) -> Any:
  """`value` if it is JSON (finite numbers), else its str()."""
  try:
    json.dumps(value, allow_nan=False)
    return value
  except (TypeError, ValueError, RecursionError):
    return str(value)
