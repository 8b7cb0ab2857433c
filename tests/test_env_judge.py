"""Judges (spec §6): the rule-based verifier, and the LLM judge against a local stub of an
OpenAI-compatible server that returns scripted replies (majority, ties, malformed, time-outs)."""

import http.server
import json
import threading
import time

import pytest
from hypothesis import given, strategies as st

from tirjax.env import judge as J
from tirjax.env.executor import ToolEnv
from tirjax.env.tools import Task, Tool
from tirjax.episodes import judging
from tirjax.trainer import sections

# -- rule-based verifier -------------------------------------------------------------------


@pytest.mark.parametrize("answer, reference, verdict", [
    ("Paris", "Paris", "true"),
    ("  the PARIS. ", "Paris", "true"),  # normalised exact match
    ("The answer is Paris.", "Paris", "true"),  # containment, framed by filler words
    ("The capital is Paris.", "Paris", "false"),  # other words: what else does it name?
    ("Paris Lyon", "Paris", "false"),
    ("The capital is Paris, France.", "Paris", "false"),  # a comma: could list candidates
    ("Paris or Lyon", "Paris", "false"),  # a hedge
    ("Lyon, Paris", "Paris", "false"),  # a list of candidates
    ("not Paris", "Paris", "false"),
    ("Parisian food", "Paris", "false"),  # whole words only
    ("15.0", "15", "true"),  # an integer exactly, whatever its spelling
    ("1,234.5 units", "1234.5", "true"),
    ("about 1,234.5 units", "1234.5", "false"),  # a hedge
    ("12346", "12345", "false"),  # integers compare exactly (a tolerance let these pass)
    ("1101112", "1101111", "false"),
    ("1, 2, 3, 4, 5, 6, 7, 8 or 9", "9", "false"),  # a list of candidates
    ("9 or 9", "9", "false"),
    ("24.83", "24.8", "true"),  # decimals to the reference's precision
    ("24.9", "24.8", "false"),
    ("324", "324.0", "true"),  # toolhop-086: the reference spells an integer as a decimal
    ("From 2020-01-01: 60 days", "60", "false"),  # other numbers than the answer
    ("-15", "15", "false"),  # the sign matters
    ("15.01", "15", "false"),
    ("$3", "3", "true"),
    (None, "Paris", "false"),  # no answer
    ("   ", "Paris", "false"),
    ("London", "Paris", "false"),
    ("I am unable to answer this.", "Paris", "false"),  # abstaining on an answerable task
    ("unable_to_answer", "unable_to_answer", "unable_to_answer"),
    ("The tools cannot answer that.", "unable_to_answer", "unable_to_answer"),
    ("Paris", "unable_to_answer", "false"),
    (None, "unable_to_answer", "false"),
    ("Jean-Paul Sartre", "Jean Paul Sartre", "true"),
])
def test_rule_verdicts(answer, reference, verdict):
  assert J.rule_verdict(answer, reference) == verdict


ABSTAIN = ("unable_to_answer", "I cannot answer this question.",
           "The city_info tool is unavailable, so I am unable to answer.")


@pytest.mark.parametrize("answer", ABSTAIN)
def test_abstention_is_earned_not_claimed(answer):
  """spec §6: an abstention earns 0 only where the task cannot be answered; on an answerable
  task it is wrong (−1), so abstaining never beats answering; an answer to an unanswerable
  task is wrong too, and a correct abstention is not counted correct."""
  outcome = lambda a, ref: J.outcome(J.rule_verdict(a, ref))
  assert outcome(answer, "Paris") == -1.0  # answerable task, abstention
  assert outcome(answer, "42") == -1.0
  assert outcome(answer, J.UNABLE_TO_ANSWER) == 0.0  # unanswerable task, abstention
  assert outcome("Paris", J.UNABLE_TO_ANSWER) == -1.0  # unanswerable task, an answer
  assert outcome("42", J.UNABLE_TO_ANSWER) == -1.0
  assert J.rule_verdict(answer, J.UNABLE_TO_ANSWER) != "true"
  # The old rule, kept to reproduce the collapse it causes: abstaining pays 0 anywhere.
  claimed = J.RuleOptions(abstention="claimed")
  assert J.rule_verdict(answer, "Paris", claimed) == J.UNABLE_TO_ANSWER
  assert J.rule_verdict(answer, J.UNABLE_TO_ANSWER, claimed) == J.UNABLE_TO_ANSWER
  assert J.rule_verdict("Lyon", "Paris", claimed) == "false"
  with pytest.raises(ValueError, match="abstention"):
    J.RuleOptions(abstention="free")


def test_llm_rubric_states_the_earned_abstention():
  """The LLM judge's rubric says what the rule judge does (spec §6)."""
  rubric = J.SYSTEM_PROMPT
  true_line = next(l for l in rubric.splitlines() if l.startswith("- true:"))
  unable_line = next(l for l in rubric.splitlines() if l.startswith("- unable_to_answer:"))
  false_line = next(l for l in rubric.splitlines() if l.startswith("- false:"))
  assert "cannot answer" not in true_line  # a correct abstention is not "true"
  assert "reference answer is 'unable_to_answer'" in unable_line
  assert "cannot answer although the reference gives an answer" in false_line
  assert "gives an answer where the reference is 'unable_to_answer'" in false_line


@given(st.text(min_size=1, max_size=20).filter(lambda s: J.normalize(s)))
def test_rule_answer_equal_to_reference_is_true(text):
  assert J.rule_verdict(text, text) == "true"
  assert J.rule_verdict(f"The answer is {text}.", text) == "true"


@given(st.integers(-10**7, 10**7), st.integers(0, 4), st.integers(-20, 20))
def test_rule_numbers_at_the_references_precision(value, places, shift):
  """A reference of `places` decimals matches a number within half a unit of its last place
  and nothing further; an integer reference only itself."""
  ref = f"{value / 10**places:.{places}f}"
  unit = 10.0 ** -places
  close = value / 10**places + shift / 50 * unit  # within ±0.4 units of the last place
  want = "true" if places or not shift else "false"  # integers: exactly
  assert J.rule_verdict(f"{close:.{places + 2}f}", ref) == want
  if shift:
    off = value / 10**places + (1 if shift > 0 else -1) * unit
    assert J.rule_verdict(f"{off:.{places}f}", ref) == "false"


def test_outcomes_and_options():
  assert [J.outcome(v) for v in J.VERDICTS] == [1.0, -1.0, 0.0]
  with pytest.raises(ValueError, match="reference"):
    J.rule_verdict("x", None)
  with pytest.raises(ValueError, match="votes"):
    J.LLMJudgeOptions(base_url="http://x/v1", model="m", votes=0)
  with pytest.raises(ValueError, match="on_no_vote"):
    J.LLMJudgeOptions(base_url="http://x/v1", model="m", on_no_vote="maybe")
  with pytest.raises(ValueError, match="base_url"):
    J.LLMJudgeOptions(base_url="localhost:8000", model="m")


@pytest.mark.parametrize("reply, vote", [
    ("The answer matches.\nVERDICT: true", "true"),
    ("verdict: FALSE", "false"),
    ("**Verdict:** unable_to_answer", "unable_to_answer"),
    ("VERDICT: false\n...on reflection...\nVERDICT: true", "true"),  # the last line counts
    ("true", "true"),
    ("It is probably right.", None),
    ("VERDICT: maybe", None),
    ("", None),
])
def test_parse_vote(reply, vote):
  assert J.parse_vote(reply) == vote


@pytest.mark.parametrize("votes, result", [
    (["true", "true", "false", "true", "false"], ("true", "majority")),
    (["true", None, None, "false", "false"], ("false", "majority")),
    (["true", "true", "false", "false", None], ("false", "tie")),
    (["true", "unable_to_answer", None, None, None], ("unable_to_answer", "tie")),
    (["unable_to_answer", "false", "true", None, None], ("false", "tie")),
    ([None] * 5, (None, "none")),
])
def test_majority(votes, result):
  assert J.majority(votes) == result


# -- LLM judge against a stub server -------------------------------------------------------


class Stub:
  """Pops one scripted behaviour per request: a reply text, "!500", "!garbage" or "!sleep"."""

  def __init__(self):
    self.script, self.requests, self.lock = [], [], threading.Lock()
    stub = self

    class Handler(http.server.BaseHTTPRequestHandler):
      def log_message(self, *args):
        pass

      def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with stub.lock:
          stub.requests.append((self.path, dict(self.headers), body))
          action = stub.script.pop(0)
        if action == "!sleep":
          time.sleep(0.6)
          action = "VERDICT: true"
        if action == "!500":
          self.send_response(500)
          self.end_headers()
          return
        payload = (b"not json" if action == "!garbage" else json.dumps(
            {"choices": [{"message": {"role": "assistant", "content": action}}]}).encode())
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        try:
          self.wfile.write(payload)
        except OSError:  # the client gave up (time-out)
          pass

    self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self.server.daemon_threads = True
    self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
    self.thread.start()
    self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

  def run(self, script, traj, **options):
    self.script, self.requests = list(script), []
    opts = dict(base_url=self.url, model="judge-model", timeout_s=0.25, retries=0)
    opts.update(options)
    return J.LLMJudge(J.LLMJudgeOptions(**opts)).judge(traj)


@pytest.fixture(scope="module")
def stub():
  s = Stub()
  yield s
  s.server.shutdown()
  s.server.server_close()


TRAJ = J.Trajectory(question="What is 1 + 2?",
                    steps=[('<think>add</think><tool_call>[{"name": "add"}]</tool_call>',
                            '[{"name": "add", "result": 3}]')],
                    answer="3", reference="3")
V = "VERDICT: "


def test_llm_judge_sees_the_whole_trajectory(stub):
  j = stub.run([V + "true"] * 5, TRAJ, api_key="k")
  assert j == J.Judgement("true", ("true",) * 5, "majority")
  assert len(stub.requests) == 5
  path, headers, body = stub.requests[0]
  assert path == "/v1/chat/completions" and headers["Authorization"] == "Bearer k"
  assert body["model"] == "judge-model" and body["temperature"] == 1.0
  user = body["messages"][1]["content"]
  for part in ("What is 1 + 2?", '"name": "add"', '"result": 3', "## Final answer\n3",
               "## Reference answer\n3"):
    assert part in user


@pytest.mark.parametrize("script, verdict, source", [
    ([V + "true", V + "true", V + "false", V + "false", V + "false"], "false", "majority"),
    ([V + "true", V + "true", V + "true", "!garbage", "rambling"], "true", "majority"),
    ([V + "true", V + "true", V + "false", V + "false", "no idea"], "false", "tie"),
    ([V + "true", V + "unable_to_answer", "!500", "!garbage", "???"], "unable_to_answer", "tie"),
    (["!sleep", "!sleep", "!sleep", V + "false", "!sleep"], "false", "majority"),
    (["!500", "!garbage", "!sleep", "nonsense", "VERDICT: perhaps"], "true", "rule"),
])
def test_llm_judge_votes(stub, script, verdict, source):
  j = stub.run(script, TRAJ)
  assert (j.verdict, j.source) == (verdict, source)
  assert len(j.votes) == 5


def test_llm_judge_no_vote_false_retries_and_no_answer(stub):
  j = stub.run(["!500"] * 5, TRAJ, on_no_vote="false")
  assert (j.verdict, j.source) == ("false", "false")
  j = stub.run(["!500", V + "true"], TRAJ, votes=1, retries=1)
  assert j.votes == ("true",) and len(stub.requests) == 2
  j = stub.run([], J.Trajectory("q", [], None, "3"))
  assert j == J.Judgement("false", (), "no_answer") and stub.requests == []


@pytest.mark.parametrize("abstention, verdict", [("earned", "false"),
                                                 ("claimed", J.UNABLE_TO_ANSWER)])
def test_configured_llm_judge_falls_back_on_the_configured_abstention_rule(stub, abstention,
                                                                           verdict):
  """Issue 42: the LLM judge the trainer builds (`judging.make_judge`, judge.kind="llm")
  judges by the rule of `judge.abstention` when no vote is valid."""
  stub.script, stub.requests = ["no idea"] * 5, []
  judge = judging.make_judge(sections.JudgeOptions(
      kind="llm", base_url=stub.url, model="judge-model", abstention=abstention))
  j = judge(J.Trajectory("What is 1 + 2?", [], "I cannot answer this question.", "3"))
  assert (j.verdict, j.source) == (verdict, "rule") and len(stub.requests) == 5


def test_trajectory_of_an_episode():
  task = Task("t", "Q?", [Tool("ping", "", {"type": "object"}, lambda: "pong")], "pong")
  env = ToolEnv(task)
  env.step('<think>a</think><tool_call>[{"name": "ping", "arguments": {}}]</tool_call>')
  env.step('<think>b</think><tool_call>[{"name": "response_gen", "arguments": '
           '{"answer": "pong"}}]</tool_call>')
  traj = J.trajectory_of(env)
  assert traj.question == "Q?" and traj.answer == "pong" and traj.reference == "pong"
  assert len(traj.steps) == 2 and '"result": "pong"' in traj.steps[0][1]
