"""The evaluation agent: verdicts true / false / unable_to_answer → +1 / −1 / 0 (spec §6).

Two judges with one rule for a missing answer (no `response_gen` within T_max → "false"):

* `rule_verdict`: the final answer against the reference with no near miss passing
  (`matches`): numbers at the reference's precision, every number of the answer counted;
  strings normalised, exactly or as whole words of an answer that hedges nothing.
  `unable_to_answer` (R_out 0) is earned, not claimed (spec §6): an answer that says it cannot
  answer gets it only when the reference is `unable_to_answer` (the task cannot be answered
  with the tools as they behaved); on an answerable task the same answer is "false" (−1), and
  a correct abstention never counts as correct. Were abstaining paid 0 on answerable tasks,
  it would beat answering whenever the policy is right less than half the time (2p − 1 < 0),
  and RL would learn to abstain (GRPO at lr 1e-3 did, issue 26).
* `LLMJudge`: any OpenAI-compatible `/chat/completions` endpoint (through httpx's
  pooled client). It sees the whole trajectory, is asked `votes` (5) times independently, and the
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
import decimal
import math
import re
import unicodedata
from collections import Counter
from typing import Optional, Sequence

import httpx

from tirjax import option_checks
from tirjax.env.tools import UNABLE_TO_ANSWER

VERDICTS = ("true", "false", UNABLE_TO_ANSWER)
OUTCOME = {"true": 1.0, "false": -1.0, UNABLE_TO_ANSWER: 0.0}
_PESSIMISM = ("false", UNABLE_TO_ANSWER, "true")  # tie-break order
_ARTICLES = {"a", "an", "the"}
_UNABLE_PHRASES = ("unable to answer", "cannot answer", "can not answer", "cant answer",
                   "not able to answer", "cannot be answered", "unable to determine",
                   "cannot determine", "insufficient information", "not enough information")
_FILLER = frozenset({"final", "answer", "is", "it", "its", "result", "so", "thus", "therefore",
                     "here", "that", "this", "answers", "my", "correct", "which"})
# Words a number may carry: units and counts ("1,528 km", "60 days", "45%"); no single
# letters, which are answers of their own (ToolHop asks for letters).
_UNITS = frozenset({"km", "mi", "mile", "miles", "meter", "meters", "metre", "metres", "ft",
                    "feet", "foot", "kg", "kilograms", "lb", "lbs", "pound", "pounds",
                    "celsius", "fahrenheit", "degrees", "degree", "day", "days", "year", "years",
                    "people", "staff", "employees", "percent", "usd", "dollars", "million",
                    "units", "unit", "times", "points", "inhabitants"})
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?")


def outcome(verdict: str) -> float:
  """R_out of a verdict: +1, −1 or 0."""
  return OUTCOME[verdict]


# -- rule-based verifier -------------------------------------------------------------------


ABSTENTION_RULES = ("earned", "claimed")


@dataclasses.dataclass(frozen=True)
class RuleOptions:
  """Attributes:
    containment: a string reference also matches as a run of whole words framed only by
      filler words ("the final answer is", "so", ...): "The answer is Paris." is true;
      "Paris or Lyon", "Lyon, Paris", "maybe Paris" and "The capital is Paris" (what else
      does it name?) are not.
    abstention: "earned" (spec §6, the default): an abstention is `unable_to_answer` only on
      a task whose reference is `unable_to_answer`, "false" elsewhere. "claimed": the rule
      before spec §6 closed it, any abstention on an answerable task is `unable_to_answer`;
      kept to reproduce the abstention collapse it causes, not for training.
  """

  containment: bool = True
  abstention: str = "earned"

  def __post_init__(self):
    option_checks.one_of("abstention", self.abstention, ABSTENTION_RULES)


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


def decimals(reference: str) -> int:
  """Decimal places the reference is given to ("12" → 0, "24.80" → 2, "1e3" → 0)."""
  t = reference.strip().replace(",", "").removeprefix("$").removesuffix("%").strip().lower()
  mantissa = t.split("e")[0]
  return len(mantissa.split(".")[1]) if "." in mantissa else 0


def _decimal(text: str) -> Optional[decimal.Decimal]:
  t = text.strip().replace(",", "").removeprefix("$").removesuffix("%").strip()
  try:
    x = decimal.Decimal(t)
  except decimal.InvalidOperation:
    return None
  return x if x.is_finite() else None


def numbers_in(answer: str) -> list[decimal.Decimal]:
  """Every number written in the answer, in order, exactly as written (decimal)."""
  found = (_decimal(m.group()) for m in _NUMBER.finditer(answer))
  return [x for x in found if x is not None]


def same_number(x: decimal.Decimal, reference: str) -> bool:
  """x equals the reference at the reference's precision: exactly for an integer reference,
  rounded half up to its decimal places otherwise (decimal arithmetic: 610.75 is 610.8, not
  610.7, whatever binary floats make of it)."""
  ref = _decimal(reference)
  places = decimals(reference)
  if ref is None:
    return False
  if places == 0:
    return x == ref
  unit = decimal.Decimal(1).scaleb(-places)
  return x.quantize(unit, rounding=decimal.ROUND_HALF_UP) == ref.quantize(unit)


def matches(answer: str, reference: str, options: RuleOptions = RuleOptions()) -> bool:
  """Whether a final answer states the reference (spec §6.1's rule judge; no near miss passes).

  A numeric reference: the answer holds at least one number, every number in it equals the
  reference at its precision (integers exactly, decimals to the reference's places), and its
  other words are units or filler, so a changed digit, a list of candidates, "about 15" or
  "Lyon 15" never matches, while "1,528 km" or "324.0" for "324" does. Any other reference: the normalised answer equals it,
  or (with `containment`) holds it framed by filler words only (a hedge word, another name
  or a list of candidates is not filler).
  """
  ref = parse_number(reference)
  if ref is not None:
    found = numbers_in(answer)
    words = [w for w in normalize(_NUMBER.sub(" ", answer)).split()]
    return (bool(found) and all(same_number(x, reference) for x in found)
            and all(w in _FILLER or w in _UNITS for w in words))
  na, nr = normalize(answer), normalize(reference)
  if not nr:
    return False
  if na == nr:
    return True
  if not options.containment:
    return False
  words, ref = na.split(), nr.split()
  for i in range(len(words) - len(ref) + 1):  # the reference, framed by filler words only
    if words[i:i + len(ref)] == ref:
      return all(w in _FILLER for w in words[:i] + words[i + len(ref):])
  return False


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
  # An answerable task: saying it cannot be answered is wrong (unless the old rule is asked).
  return UNABLE_TO_ANSWER if unable and options.abstention == "claimed" else "false"


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
    option_checks.at_least("votes", self.votes, 1)
    option_checks.above("timeout_s", self.timeout_s, 0)
    option_checks.at_least("retries", self.retries, 0)
    option_checks.one_of("on_no_vote", self.on_no_vote, ("rule", "false"))
    option_checks.at_least("max_output_chars", self.max_output_chars, 1)
    option_checks.at_least("max_tokens", self.max_tokens, 1)


SYSTEM_PROMPT = (
    "You are the evaluation agent of a tool-using assistant. You see a question, the "
    "assistant's steps with the tool responses, its final answer and the reference answer. "
    "Decide whether the final answer is correct.\n"
    "- true: the final answer agrees with the reference answer (wording may differ).\n"
    "- unable_to_answer: the reference answer is 'unable_to_answer' (the task cannot be "
    "answered with the tools as they behaved: a tool was down or the information is missing) "
    "and the assistant says it cannot answer.\n"
    "- false: anything else. In particular: the assistant says it cannot answer although the "
    "reference gives an answer (a malformed call of its own does not make a task "
    "unanswerable), or it gives an answer where the reference is 'unable_to_answer'.\n"
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
    # One pooled client for the votes of every judgement (environment proxies apply).
    self._http = httpx.Client(limits=httpx.Limits(max_connections=max(options.votes, 1)))

  def close(self) -> None:
    self._http.close()

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
    body = {"model": o.model, "messages": messages, "temperature": o.temperature,
            "max_tokens": o.max_tokens}
    headers = {"Authorization": f"Bearer {o.api_key}"} if o.api_key else {}
    try:
      resp = self._http.post(o.base_url.rstrip("/") + "/chat/completions", json=body,
                             headers=headers, timeout=o.timeout_s)
      resp.raise_for_status()
      content = resp.json()["choices"][0]["message"]["content"]
      return content if isinstance(content, str) else None
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
      return None


def trajectory_of(env) -> Trajectory:
  """The `Trajectory` of a finished `ToolEnv` episode."""
  return Trajectory(question=env.task.question, steps=tuple(env.transcript),
                    answer=env.answer, reference=env.task.answer)
