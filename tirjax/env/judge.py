"""The evaluation agent: verdicts true / false / unable_to_answer → +1 / −1 / 0 (SPEC §6).

Two judges with one rule for a missing answer (no `response_gen` within T_max → "false"):

* `rule_verdict`: normalised exact match, containment of the normalised reference in the
  answer (on word boundaries), or a number in the answer within a tolerance of a numeric
  reference. The reference `unable_to_answer` is matched by an answer that says it cannot
  answer ("true"); an answer that says so to an answerable question gets "unable_to_answer".
* `LLMJudge`: any OpenAI-compatible `/chat/completions` endpoint (urllib, no extra
  dependency). It sees the whole trajectory, is asked `votes` (5) times independently, and the
  plurality of the valid votes wins. Explicit rules:
  - a reply is a valid vote when it contains `VERDICT: <verdict>` (the last such line counts)
    or is just a verdict word; anything else is a malformed vote and is discarded;
  - a request that fails (HTTP error, connection error, `timeout_s` passed, a body without
    `choices[0].message.content`) is retried `retries` times, then discarded;
  - a tie between the most-voted verdicts goes to the pessimistic one: false, then
    unable_to_answer, then true (an uncertain judge never rewards);
  - with no valid vote, `on_no_vote` decides: "rule" (the rule-based verdict) or "false".
  `Judgement.source` records which rule produced the verdict.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import math
import re
import unicodedata
import urllib.error
import urllib.request
from collections import Counter
from typing import Optional, Sequence

from tirjax.env.tools import UNABLE_TO_ANSWER

VERDICTS = ("true", "false", UNABLE_TO_ANSWER)
OUTCOME = {"true": 1.0, "false": -1.0, UNABLE_TO_ANSWER: 0.0}
_PESSIMISM = ("false", UNABLE_TO_ANSWER, "true")  # tie-break order
_ARTICLES = {"a", "an", "the"}
_UNABLE_PHRASES = ("unable to answer", "cannot answer", "can not answer", "cant answer",
                   "not able to answer", "cannot be answered", "unable to determine",
                   "cannot determine", "insufficient information", "not enough information")
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?")


def outcome(verdict: str) -> float:
  """R_out of a verdict: +1, −1 or 0."""
  return OUTCOME[verdict]


# -- rule-based verifier -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RuleOptions:
  rel_tol: float = 1e-4
  abs_tol: float = 1e-8
  containment: bool = True

  def __post_init__(self):
    if self.rel_tol < 0 or self.abs_tol < 0:
      raise ValueError(f"rel_tol / abs_tol: must be >= 0, got {self.rel_tol} / {self.abs_tol}")


def normalize(text: str) -> str:
  """NFKC, lower case, apostrophes dropped, other punctuation to spaces, no articles."""
  text = unicodedata.normalize("NFKC", text).lower().replace("'", "").replace("’", "")
  text = "".join(" " if unicodedata.category(c).startswith(("P", "S")) else c for c in text)
  return " ".join(w for w in text.split() if w not in _ARTICLES)


def says_unable(answer: str) -> bool:
  """The answer declares that the question cannot be answered."""
  norm = f" {normalize(answer)} "
  return any(f" {p} " in norm for p in _UNABLE_PHRASES)


def parse_number(text: str) -> Optional[float]:
  """`text` as one number ("1,234.5", "$3", "45%"), else None."""
  t = text.strip().replace(",", "").removeprefix("$").removesuffix("%").strip()
  try:
    x = float(t)
  except ValueError:
    return None
  return x if math.isfinite(x) else None


def matches(answer: str, reference: str, options: RuleOptions = RuleOptions()) -> bool:
  """A numeric reference matches a number of the answer within tolerance (signs and decimal
  points matter, so normalised text is not compared); any other reference matches the
  normalised answer exactly or, with `containment`, as a run of whole words."""
  ref = parse_number(reference)
  if ref is not None:
    return any(math.isclose(float(m.group().replace(",", "")), ref, rel_tol=options.rel_tol,
                            abs_tol=options.abs_tol) for m in _NUMBER.finditer(answer))
  na, nr = normalize(answer), normalize(reference)
  if not nr:
    return False
  return na == nr or (options.containment and f" {nr} " in f" {na} ")


def rule_verdict(answer: Optional[str], reference: Optional[str],
                 options: RuleOptions = RuleOptions()) -> str:
  """The rule-based verdict of a final answer against the reference."""
  if reference is None:
    raise ValueError("reference: the rule-based judge needs a reference answer")
  if answer is None or not answer.strip():
    return "false"
  unable = says_unable(answer)
  if normalize(reference) == normalize(UNABLE_TO_ANSWER):
    return UNABLE_TO_ANSWER if unable else "false"
  if matches(answer, reference, options):
    return "true"
  return UNABLE_TO_ANSWER if unable else "false"


# -- LLM judge -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Trajectory:
  """What the LLM judge sees: the question, every (step, tool response), answer, reference."""

  question: str
  steps: Sequence[tuple[str, str]]
  answer: Optional[str]
  reference: Optional[str]


@dataclasses.dataclass(frozen=True)
class Judgement:
  verdict: str
  votes: tuple  # one verdict per request, None for a malformed or failed one
  source: str  # "majority", "tie", "no_answer", "rule" or "false" (see the module docstring)


@dataclasses.dataclass(frozen=True)
class LLMJudgeOptions:
  base_url: str  # the API root, e.g. "http://localhost:8000/v1"
  model: str
  api_key: Optional[str] = None
  votes: int = 5
  temperature: float = 1.0  # independent samples, so that votes can differ
  max_tokens: int = 1024
  timeout_s: float = 60.0  # per request
  retries: int = 1  # further attempts of a failed request (not of a malformed reply)
  on_no_vote: str = "rule"
  max_output_chars: int = 2000  # each tool response is cut to this length in the prompt

  def __post_init__(self):
    if not self.base_url.startswith(("http://", "https://")):
      raise ValueError(f"base_url: must start with http:// or https://, got {self.base_url!r}")
    if self.votes < 1:
      raise ValueError(f"votes: must be >= 1, got {self.votes}")
    if self.timeout_s <= 0:
      raise ValueError(f"timeout_s: must be > 0, got {self.timeout_s}")
    if self.retries < 0:
      raise ValueError(f"retries: must be >= 0, got {self.retries}")
    if self.on_no_vote not in ("rule", "false"):
      raise ValueError(f"on_no_vote: must be 'rule' or 'false', got {self.on_no_vote!r}")
    if self.max_output_chars < 1 or self.max_tokens < 1:
      raise ValueError("max_output_chars / max_tokens: must be >= 1")


SYSTEM_PROMPT = (
    "You are the evaluation agent of a tool-using assistant. You see a question, the "
    "assistant's steps with the tool responses, its final answer and the reference answer. "
    "Decide whether the final answer is correct.\n"
    "- true: the final answer agrees with the reference answer (wording may differ), or the "
    "reference is 'unable_to_answer' and the assistant says it cannot answer.\n"
    "- unable_to_answer: the assistant says it cannot answer although the reference gives an "
    "answer.\n"
    "- false: anything else.\n"
    "Reason briefly, then end with one line: VERDICT: true, VERDICT: false or "
    "VERDICT: unable_to_answer.")

_VERDICT_LINE = re.compile(r"verdict\W{0,3}\s*[:=]\s*\W{0,3}(true|false|unable_to_answer)\b",
                           re.IGNORECASE)


def judge_prompt(trajectory: Trajectory, max_output_chars: int = 2000) -> list[dict]:
  """The chat messages sent to the judge."""
  parts = [f"## Question\n{trajectory.question}"]
  for i, (text, response) in enumerate(trajectory.steps, 1):
    if len(response) > max_output_chars:
      response = response[:max_output_chars] + f"… [{len(response) - max_output_chars} more]"
    parts.append(f"## Step {i}\n{text}\n### Tool response\n{response}")
  parts.append(f"## Final answer\n{trajectory.answer}")
  parts.append(f"## Reference answer\n{trajectory.reference}")
  return [{"role": "system", "content": SYSTEM_PROMPT},
          {"role": "user", "content": "\n\n".join(parts)}]


def parse_vote(reply: str) -> Optional[str]:
  """The verdict of one reply, or None when it is malformed."""
  found = _VERDICT_LINE.findall(reply)
  if found:
    return found[-1].lower()
  word = reply.strip().strip("\"'`*.").lower()
  return word if word in VERDICTS else None


def majority(votes: Sequence[Optional[str]]) -> tuple[Optional[str], str]:
  """(verdict, "majority" | "tie") from the valid votes; (None, "none") without any."""
  counts = Counter(v for v in votes if v is not None)
  if not counts:
    return None, "none"
  top = max(counts.values())
  best = [v for v in _PESSIMISM if counts.get(v) == top]
  return best[0], ("majority" if len(best) == 1 else "tie")


class LLMJudge:

  def __init__(self, options: LLMJudgeOptions, rule: RuleOptions = RuleOptions()):
    self.options = options
    self.rule = rule

  def judge(self, trajectory: Trajectory) -> Judgement:
    if trajectory.answer is None or not trajectory.answer.strip():
      return Judgement("false", (), "no_answer")
    messages = judge_prompt(trajectory, self.options.max_output_chars)
    with concurrent.futures.ThreadPoolExecutor(self.options.votes) as pool:
      votes = tuple(pool.map(lambda _: self._vote(messages), range(self.options.votes)))
    verdict, source = majority(votes)
    if verdict is None:
      if self.options.on_no_vote == "false" or trajectory.reference is None:
        return Judgement("false", votes, "false")
      return Judgement(rule_verdict(trajectory.answer, trajectory.reference, self.rule), votes,
                       "rule")
    return Judgement(verdict, votes, source)

  def _vote(self, messages: list[dict]) -> Optional[str]:
    for _ in range(self.options.retries + 1):
      reply = self._request(messages)
      if reply is not None:
        return parse_vote(reply)
    return None

  def _request(self, messages: list[dict]) -> Optional[str]:
    """The reply text, or None when the request failed."""
    o = self.options
    body = json.dumps({"model": o.model, "messages": messages, "temperature": o.temperature,
                       "max_tokens": o.max_tokens}).encode()
    headers = {"Content-Type": "application/json"}
    if o.api_key:
      headers["Authorization"] = f"Bearer {o.api_key}"
    req = urllib.request.Request(o.base_url.rstrip("/") + "/chat/completions", data=body,
                                 headers=headers, method="POST")
    try:
      with urllib.request.urlopen(req, timeout=o.timeout_s) as resp:
        data = json.loads(resp.read())
      content = data["choices"][0]["message"]["content"]
      return content if isinstance(content, str) else None
    except (urllib.error.URLError, TimeoutError, OSError, ValueError, KeyError, IndexError,
            TypeError):
      return None


def trajectory_of(env) -> Trajectory:
  """The `Trajectory` of a finished `ToolEnv` episode."""
  return Trajectory(question=env.task.question, steps=tuple(env.transcript),
                    answer=env.answer, reference=env.task.answer)
