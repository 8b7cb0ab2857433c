"""Step parser and executor: fuzzing against the reference count of the five checks (spec §4.1),
and a specific error message for every kind of malformed step (spec §6)."""

import json
import re

import pytest
from hypothesis import given, settings, strategies as st

from tirjax.testing.reference import env_steps as ref
from tirjax.env.executor import ToolEnvOptions, ToolEnv
from tirjax.env.parser import ParseLimits, StepParser, format_reward
from tirjax.env.tools import Task, Tool, ToolError, agent_tools

ARG_TYPES = {"add": {"a": "integer", "b": "integer"}, "echo": {"text": "string"},
             "fail": {"x": "integer"}, "crash": {"x": "integer"}, "err_obj": {"x": "integer"},
             "ping": {}}
FAILING = {"fail", "crash", "err_obj"}


def _raise(x):
  raise ToolError("fail always fails")


IMPLS = {"add": lambda a, b: a + b, "echo": lambda text: text, "fail": _raise,
         "crash": lambda x: x / 0, "err_obj": lambda x: {"error": "bad input"},
         "ping": lambda: "pong"}


def _tool(name):
  props = {k: {"type": v} for k, v in ARG_TYPES[name].items()}
  return Tool(name, f"the {name} tool", {"type": "object", "properties": props,
                                          "required": sorted(props),
                                          "additionalProperties": False}, IMPLS[name])


TASK = Task("fuzz", "q", [_tool(n) for n in ARG_TYPES], answer="3")
PARSERS = {p: StepParser(agent_tools(TASK, p), p) for p in ("response_gen", "answer_tag")}
KNOWN = "add, crash, echo, err_obj, fail, ping, response_gen"


def run(text, protocol="response_gen", **options):
  env = ToolEnv(TASK, ToolEnvOptions(answer_protocol=protocol, **options), parser=PARSERS[protocol])
  return env.step(text)


def step(calls, think="ok"):
  body = calls if isinstance(calls, str) else json.dumps(calls, ensure_ascii=False)
  return f"<think>{think}</think>\n<tool_call>{body}</tool_call>"


# -- strategies ----------------------------------------------------------------------------

texts = st.text(max_size=12)
json_scalars = st.one_of(st.integers(-10**6, 10**6),
                         st.floats(allow_nan=False, allow_infinity=False, width=32),
                         st.text(max_size=8), st.booleans(), st.none())
json_values = st.recursive(json_scalars, lambda c: st.one_of(
    st.lists(c, max_size=3), st.dictionaries(st.text(max_size=4), c, max_size=3)),
                           max_leaves=6)
names = st.sampled_from(list(ARG_TYPES) + ["response_gen", "nope", "Add", ""])


@st.composite
def good_args(draw, name):
  gen = {"integer": st.integers(-1000, 1000), "string": st.text(max_size=10)}
  if name == "response_gen":
    return {"answer": draw(st.text(max_size=10))}
  return {k: draw(gen[v]) for k, v in ARG_TYPES.get(name, {}).items()}


@st.composite
def calls(draw):
  name = draw(names)
  args = draw(st.one_of(good_args(name), st.dictionaries(
      st.sampled_from(["a", "b", "text", "x", "answer", "zz"]), json_values, max_size=3)))
  call = {"name": name, "arguments": args}
  shape = draw(st.sampled_from(["ok"] * 6 + ["no_args", "extra", "str_args", "int_name"]))
  if shape == "no_args":
    del call["arguments"]
  elif shape == "extra":
    call["id"] = 1
  elif shape == "str_args":
    call["arguments"] = json.dumps(args)
  elif shape == "int_name":
    call["name"] = 7
  return call


@st.composite
def bodies(draw):
  kind = draw(st.sampled_from(["array"] * 5 + ["object", "truncated", "scalar", "empty", "deep",
                                                 "huge", "nan", "dup", "text", "many"]))
  array = draw(st.lists(calls(), min_size=1, max_size=3))
  if kind == "array":
    return json.dumps(array, ensure_ascii=draw(st.booleans()))
  if kind == "object":
    return json.dumps(array[0])
  if kind == "truncated":
    full = json.dumps(array)
    return full[:draw(st.integers(0, len(full) - 1))]
  if kind == "scalar":
    return json.dumps(draw(json_scalars))
  if kind == "empty":
    return draw(st.sampled_from(["[]", "", "  "]))
  if kind == "deep":
    n = draw(st.integers(1, 40))
    return '[{"name": "echo", "arguments": {"text": ' + "[" * n + "]" * n + "}}]"
  if kind == "huge":
    return json.dumps([{"name": "echo", "arguments": {"text": "x" * 33_000}}])
  if kind == "nan":
    return '[{"name": "add", "arguments": {"a": NaN, "b": 1}}]'
  if kind == "dup":
    return '[{"name": "ping", "name": "ping", "arguments": {}}]'
  if kind == "many":
    return json.dumps([{"name": "ping", "arguments": {}}] * 9)
  return draw(texts)


@st.composite
def steps(draw):
  t, body = draw(texts), draw(bodies())
  think = draw(st.sampled_from(["<think>{}</think>"] * 6 + [
      "<think>{}", "", "{}", "<thinking>{}</thinking>", "<thi", "x<think>{}</think>"]))
  block = draw(st.sampled_from(["<tool_call>{}</tool_call>"] * 6 + [
      "<tool_call>{}", "{}", "<tool_call>{}</tool_ca", "<tool_call>{}</tool_call>junk",
      "<tool_call>{}</tool_call><tool_call>[]</tool_call>", "<answer>{}</answer>",
      "<answer>{}", "<answer>{}</answer>x", ""]))
  space = st.sampled_from(["", " ", "\n", "\n\n", "\t"])
  return (draw(space) + think.format(t) + draw(space) + block.format(body) + draw(space))


# -- fuzzing: the count of checks, the shape of the reply ----------------------------------


@pytest.mark.slow
@settings(max_examples=1000)
@given(steps(), st.sampled_from(["response_gen", "answer_tag"]))
def test_checks_match_reference_and_reply_is_well_formed(text, protocol):
  r = run(text, protocol)
  want = ref.checks_passed(text, ARG_TYPES, FAILING, protocol)
  assert r.checks_passed == want, (r.error, text)
  assert r.format_reward == pytest.approx(ref.format_reward(want))
  assert (r.error is None) == (want == 5)
  assert r.error is None or r.error.strip()
  reply = json.loads(r.response_content)
  r.response_content.encode("utf-8")  # always encodable for the tokenizer
  assert isinstance(reply, list)
  assert reply or (protocol == "answer_tag" and r.answered)  # an answer step has no calls
  if want < 3:
    assert reply == [{"error": r.error}] and r.calls == [] and not r.answered
  elif r.answer is None or protocol == "response_gen":
    all_calls = json.loads(text[text.index("<tool_call>") + 11:text.index("</tool_call>")])
    assert [e["name"] for e in reply] == [c["name"] for c in all_calls]
    for e in reply:
      assert set(e) in ({"name", "result"}, {"name", "error"})
      assert "result" in e or e["error"].strip()
    kept = [c for c in all_calls if not (protocol == "response_gen" and
                                         c["name"] == "response_gen")]
    assert r.calls == kept and len(r.call_results) == len(kept) == len(r.call_solves)


@settings(max_examples=300)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=20))
def test_format_reward_of_counts(counts):
  for c in counts:
    assert format_reward(c) == pytest.approx(ref.format_reward(c))
    assert -0.25 <= format_reward(c) <= 0.25


def test_format_reward_rejects_bad_counts():
  with pytest.raises(ValueError, match="checks_passed"):
    format_reward(6)


# -- a specific message for each malformation ----------------------------------------------


@settings(max_examples=150)
@given(texts, st.sampled_from(["", "<think>", "<think>{}", "<thi", "<think>{}</thi"]))
def test_truncated_think(t, form):
  r = run(form.format(t.replace("<", "")))
  assert r.checks_passed == 0
  assert re.search(r"unclosed <think>|missing <think>|empty step", r.error), r.error


@settings(max_examples=150)
@given(st.lists(calls(), min_size=1, max_size=2), st.sampled_from(
    ["<tool_call>{}", "<tool_call>{}</tool_c", "<tool_call>{}</"]))
def test_truncated_tool_call(cs, form):
  r = run("<think>a</think>" + form.format(json.dumps(cs)))
  assert r.checks_passed == 1
  assert "unclosed <tool_call>: no </tool_call> follows" in r.error


@settings(max_examples=300)
@given(st.lists(calls(), min_size=1, max_size=3), st.data())
def test_invalid_json_names_the_position(cs, data):
  full = json.dumps(cs)
  cut = full[:data.draw(st.integers(1, len(full) - 1))]
  r = run(step(cut))
  assert r.checks_passed == 2
  m = re.fullmatch(r"invalid JSON in <tool_call> at line (\d+) column (\d+) \(char (\d+)\): .+",
                   r.error)
  assert m and int(m.group(3)) <= len(cut), r.error


@settings(max_examples=150)
@given(calls())
def test_single_object_instead_of_array(call):
  r = run(step(json.dumps(call)))
  assert r.checks_passed == 2
  assert "got a single object; wrap it in [ ]" in r.error


@settings(max_examples=200)
@given(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,11}", fullmatch=True).filter(
    lambda s: s not in ARG_TYPES and s != "response_gen"))
def test_unknown_tool_lists_known_names(name):
  r = run(step([{"name": name, "arguments": {}}, {"name": "ping", "arguments": {}}]))
  assert r.checks_passed == 3
  assert "unknown tool; known tools: " + KNOWN in r.error
  assert json.loads(r.response_content)[1] == {"name": "ping", "result": "pong"}


@settings(max_examples=200)
@given(st.text(min_size=0, max_size=12).filter(lambda s: not (s.isascii() and s.isidentifier())),
       st.booleans())
def test_a_name_that_is_not_an_identifier_makes_the_call_malformed(name, as_argument):
  """spec §6, Verdicts: call strings that a checker evaluates are built of these names, so
  nothing else gets that far: the step fails check 3 and none of its calls runs."""
  call = ({"name": "add", "arguments": {name: 1, "b": 2}} if as_argument else
          {"name": name, "arguments": {}})
  r = run(step([{"name": "ping", "arguments": {}}, call]))
  assert r.checks_passed == 2 and "is not an identifier" in r.error
  assert r.calls == [] and json.loads(r.response_content) == [{"error": r.error}]


@pytest.mark.parametrize("call", [{"name": "add", "arguments": {"\uff41": 1, "b": 2}},
                                  {"name": "\uff41dd", "arguments": {"a": 1, "b": 2}}])
def test_a_fullwidth_name_is_a_malformed_call_for_the_run_and_the_verdict(call):
  """Issue 56: Python's eval folds a fullwidth identifier to its NFKC form (a checker's call
  string `add(ａ=1, b=2)` calls `add(a=1, b=2)`) while the live call passes `ａ` as it is and
  fails: such a name is refused (check 3) before either sees it, so they cannot disagree."""
  assert eval("(lambda a, b: a + b)(\uff41=1, b=2)") == 3  # what a checker would compute
  r = run(step([call]))
  assert r.checks_passed == 2 and "is not an identifier (ASCII letters" in r.error
  assert r.calls == []
  from tirjax.env.datasets import bfcl
  with pytest.raises(ValueError, match="call names must be ASCII identifiers"):
    bfcl.decode_calls([call])


def test_the_checker_injection_of_issue_40_is_a_malformed_call():
  code = "__import__('os').system('id')"
  r = run(step([{"name": "len", "arguments": {f"a={code},b": 1}}]))
  assert r.checks_passed == 2 and r.calls == []
  assert 'the argument name "a=__import__' in r.error


@settings(max_examples=200)
@given(st.integers(-99, 99), st.sampled_from(["a", "b"]))
def test_missing_argument_is_named(v, keep):
  r = run(step([{"name": "add", "arguments": {keep: v}}]))
  other = "b" if keep == "a" else "a"
  assert r.checks_passed == 3
  assert f"missing required argument '{other}'" in r.error


@settings(max_examples=200)
@given(st.one_of(st.text(max_size=5), st.booleans(), st.lists(st.integers(-9, 9), max_size=2),
                 st.floats(allow_nan=False, allow_infinity=False).filter(
                     lambda f: not f.is_integer())))
def test_mistyped_argument_is_named(bad):
  r = run(step([{"name": "add", "arguments": {"a": bad, "b": 1}}]))
  assert r.checks_passed == 3
  assert re.search(r"argument 'a': expected integer, got (string|boolean|array|number)",
                   r.error), r.error


def test_unexpected_argument_and_arguments_as_string():
  r = run(step([{"name": "add", "arguments": {"a": 1, "b": 2, "c": 3}}]))
  assert "unexpected argument 'c'" in r.error
  r = run(step([{"name": "add", "arguments": '{"a": 1, "b": 2}'}]))
  assert r.checks_passed == 2 and "JSON-encoded string; give the object itself" in r.error


@settings(max_examples=60)
@given(st.integers(1, 400))
def test_huge_arguments_hit_the_size_limit(extra):
  r = run(step([{"name": "echo", "arguments": {"text": "y" * (32_768 + extra)}}]))
  assert r.checks_passed == 2
  assert re.fullmatch(r"the <tool_call> content has \d+ characters; the limit is 32768", r.error)


@settings(max_examples=100)
@given(st.integers(14, 3000))
def test_deep_nesting_hits_the_depth_limit(n):
  body = '[{"name": "echo", "arguments": {"text": ' + "[" * n + "]" * n + "}}]"
  r = run(step(body))
  assert r.checks_passed == 2
  assert "nests deeper than the limit of 16" in r.error


def test_limits_on_calls_and_arguments_and_numbers():
  r = run(step([{"name": "ping", "arguments": {}}] * 9))
  assert r.checks_passed == 2 and "9 calls in one step; the limit is 8" in r.error
  r = run(step([{"name": "echo", "arguments": {f"k{i}": i for i in range(33)}}]))
  assert r.checks_passed == 2 and "33 arguments; the limit is 32" in r.error
  r = run(step('[{"name": "add", "arguments": {"a": NaN, "b": 1}}]'))
  assert r.checks_passed == 2 and "NaN is not valid JSON" in r.error
  r = run(step('[{"name": "add", "arguments": {"a": 1e999, "b": 1}}]'))
  assert r.checks_passed == 2 and "out of range" in r.error
  r = run(step('[{"name": "add", "arguments": {"a": ' + "9" * 30 + ', "b": 1}}]'))
  assert r.checks_passed == 2 and "64-bit integers only" in r.error
  r = run(step('[{"name": "ping", "arguments": {}, "arguments": {}}]'))
  assert r.checks_passed == 2 and 'duplicate key "arguments"' in r.error
  with pytest.raises(ValueError, match="max_depth"):
    ParseLimits(max_depth=2)


@settings(max_examples=200)
@given(st.text(min_size=1, max_size=30))
def test_unicode_round_trips(t):
  r = run(step([{"name": "echo", "arguments": {"text": t}}]))
  assert r.checks_passed == 5
  assert json.loads(r.response_content) == [{"name": "echo", "result": t}]
  assert r.calls == [{"name": "echo", "arguments": {"text": t}}]


def test_unpaired_surrogate_is_rejected():
  r = run(step('[{"name": "echo", "arguments": {"text": "a\\ud800b"}}]'))
  assert r.checks_passed == 2 and "unpaired surrogate \\ud800" in r.error


def test_block_level_messages():
  assert "<answer> is not used under the response_gen protocol" in run(
      "<think>a</think><answer>3</answer>").error
  assert "more than one <tool_call> block" in run(step("[]") + "<tool_call>[]</tool_call>").error
  assert "unexpected text after </tool_call>" in run(step("[]") + " thanks").error
  assert "unexpected text before <think>" in run("Sure! " + step("[]")).error
  assert "the array of calls is empty" in run(step("[]")).error
  assert "the <tool_call> block is empty" in run(step("")).error
  assert "end the episode with <answer>" in run(
      step([{"name": "response_gen", "arguments": {"answer": "3"}}]), "answer_tag").error


# -- executor ------------------------------------------------------------------------------


def test_each_call_error_is_isolated():
  r = run(step([{"name": "fail", "arguments": {"x": 1}},
                {"name": "add", "arguments": {"a": 1, "b": 2}},
                {"name": "crash", "arguments": {"x": 1}},
                {"name": "err_obj", "arguments": {"x": 1}},
                {"name": "echo", "arguments": {"text": "é"}}]))
  assert json.loads(r.response_content) == [
      {"name": "fail", "error": "fail always fails"}, {"name": "add", "result": 3},
      {"name": "crash", "error": "ZeroDivisionError: division by zero"},
      {"name": "err_obj", "result": {"error": "bad input"}}, {"name": "echo", "result": "é"}]
  assert r.checks_passed == 4 and r.error == "fail always fails"
  r = run(step([{"name": "err_obj", "arguments": {"x": 1}}]), error_results=False)
  assert r.checks_passed == 5


def test_outputs_are_json_or_refused():
  tools = [Tool("obj", "", {"type": "object"}, lambda: object()),
           Tool("nan", "", {"type": "object"}, lambda: float("nan")),
           Tool("big", "", {"type": "object"}, lambda: "z" * 200),
           Tool("missing", "", {"type": "object"})]
  env = ToolEnv(Task("t", "q", tools, "x"), ToolEnvOptions(max_output_chars=100, max_steps=3))
  reply = json.loads(env.step(step([{"name": n, "arguments": {}} for n in
                                    ("obj", "nan", "big", "missing")])).response_content)
  assert reply[0]["result"].startswith("<object object") and reply[1]["result"] == "nan"
  assert reply[2]["error"] == "tool output too large: 202 characters (limit 100)"
  assert reply[3]["error"] == "tool 'missing' has no implementation here"


def test_episode_ends_on_response_gen_or_step_limit():
  env = ToolEnv(TASK, ToolEnvOptions(max_steps=3), parser=PARSERS["response_gen"])
  r = env.step(step([{"name": "add", "arguments": {"a": 1, "b": 2}}]))
  assert not r.done and not r.answered
  r = env.step(step([{"name": "response_gen", "arguments": {"answer": "3"}},
                     {"name": "response_gen", "arguments": {"answer": "4"}}]))
  assert r.done and r.answered and r.answer == "3" and r.checks_passed == 4
  assert r.calls == [] and "already called" in r.error
  with pytest.raises(RuntimeError, match="after the episode ended"):
    env.step(step([{"name": "ping", "arguments": {}}]))
  s = env.summary()
  assert (s.num_steps, s.answered, s.answer, s.num_calls) == (2, True, "3", 1)

  env = ToolEnv(TASK, ToolEnvOptions(max_steps=2), parser=PARSERS["response_gen"])
  env.step("garbage")
  r = env.step(step([{"name": "response_gen", "arguments": {"answer": 3}}]))  # mistyped answer
  assert r.done and not r.answered and r.answer is None
  assert env.summary().format_rewards == (-0.25, format_reward(3))


def test_answer_tag_protocol():
  env = ToolEnv(TASK, ToolEnvOptions(answer_protocol="answer_tag"), parser=PARSERS["answer_tag"])
  r = env.step(step([{"name": "ping", "arguments": {}}]))
  assert r.checks_passed == 5 and not r.done
  r = env.step("<think>done</think>\n<answer> 42 </answer>\n")
  assert r.done and r.answered and r.answer == "42" and r.checks_passed == 5


def test_ftrl_solves_remove_verified_answers():
  task = Task("f", "q", [_tool("echo")], "x", expected={"echo": ["hello", "big, world"]})
  env = ToolEnv(task, ToolEnvOptions(max_steps=5))
  texts = ["Hello, there", "hello", "a BIG world", "nothing"]
  r = env.step(step([{"name": "echo", "arguments": {"text": t}} for t in texts]))
  assert r.call_solves == [True, False, True, False]
  s = env.summary()
  assert (s.num_calls, s.num_solved, s.num_expected) == (4, 2, 2)


def test_solve_scoring_runs_schema_violating_calls_as_ftrls_scorer_does():
  """bytedance/FTRL's scorer calls the tool function with the arguments as given: a wrong type
  runs (and may solve), a missing or extra argument fails in the call. "strict" refuses both,
  and a task without expected answers always refuses; format check 4 fails either way."""
  task = Task("f", "q", [_tool("echo"), _tool("add")], "x", expected={"echo": ["12"]})
  calls = [{"name": "echo", "arguments": {"text": 12}},           # wrong type: runs
           {"name": "add", "arguments": {"a": 1, "b": 2, "c": 3}},  # extra argument: TypeError
           {"name": "nope", "arguments": {}}]                      # unknown tool: refused
  env = ToolEnv(task, ToolEnvOptions(max_steps=3))
  r = env.step(step(calls))
  assert r.call_results[0] == {"name": "echo", "result": 12} and r.call_solves == [True, False,
                                                                                    False]
  assert "TypeError" in r.call_results[1]["error"] and "unknown tool" in r.call_results[2]["error"]
  assert r.checks_passed == 3
  assert (env.summary().num_calls, env.summary().num_solved) == (3, 1)
  strict = ToolEnv(task, ToolEnvOptions(max_steps=3, solve_scoring="strict")).step(step(calls))
  assert "expected string, got integer 12" in strict.call_results[0]["error"]
  assert strict.call_solves == [False, False, False] and strict.checks_passed == 3
  plain = Task("p", "q", [_tool("echo")], "x")  # not Solve-scored: refused under "ftrl" too
  r = ToolEnv(plain, ToolEnvOptions(max_steps=3)).step(step(calls[:1]))
  assert "error" in r.call_results[0]
  with pytest.raises(ValueError, match="solve_scoring"):
    ToolEnvOptions(solve_scoring="lenient")


def test_session_is_opened_per_episode_and_closed():
  log = []

  class Session:
    def call(self, name, arguments):
      log.append(name)
      return len(log)

    def close(self):
      log.append("closed")

  task = Task("s", "q", [Tool("tick", "", {"type": "object"})], "x", session=Session)
  env = ToolEnv(task, ToolEnvOptions(max_steps=2))
  assert env.step(step([{"name": "tick", "arguments": {}}] * 2)).call_results == [
      {"name": "tick", "result": 1}, {"name": "tick", "result": 2}]
  env.step("x")
  assert log == ["tick", "tick", "closed"]


def test_options_and_tools_are_validated():
  with pytest.raises(ValueError, match="max_steps"):
    ToolEnvOptions(max_steps=0)
  with pytest.raises(ValueError, match="answer_protocol"):
    ToolEnvOptions(answer_protocol="xml")
  with pytest.raises(ValueError, match="tool 'bad': invalid JSON schema"):
    StepParser([Tool("bad", "", {"type": "objekt"})])
  with pytest.raises(ValueError, match="names must be distinct"):
    StepParser([_tool("add"), _tool("add")])


# -- messages the policy reads (issue 14) ----------------------------------------------------

_SCHEMA = {"type": "object", "properties": {k: {"type": "integer"} for k in "abcdefg"},
           "required": list("abcdefg"), "additionalProperties": False}


def test_missing_arguments_are_listed_once_and_the_rest_counted_right():
  from tirjax.env.schemas import check_arguments
  assert check_arguments(_SCHEMA, {}) == [
      "missing required arguments 'a', 'b', 'c', 'd', 'e', 'f', 'g'"]
  bad = {k: "x" for k in "abcdefg"}
  out = check_arguments(_SCHEMA, bad)
  assert len(out) == len(set(out))
  shown = [m for m in out if not m.startswith("and ")]
  assert out[-1] == f"and {7 - len(shown)} more"


def test_argument_names_with_quotes_are_escaped():
  from tirjax.env.schemas import check_arguments
  (msg,) = [m for m in check_arguments(_SCHEMA, {"x'y": 1, **{k: 1 for k in "abcdefg"}})]
  assert msg == 'unexpected argument "x\'y"'


def test_a_close_tag_inside_an_argument_is_named():
  from tirjax.env.parser import StepParser
  from tirjax.env.tools import Tool
  p = StepParser([Tool(name="f", description="d", parameters={"type": "object"},
                       fn=lambda **k: 1)], "response_gen")
  err = p.parse('<think>x</think><tool_call>[{"name": "f", "arguments": {"s": "a</tool_call>b"'
                '}}]</tool_call>').error
  assert "appears twice" in err and "<\\/tool_call>" in err


def test_huge_integers_are_out_of_range_without_pythons_hint():
  from tirjax.env.parser import StepParser
  from tirjax.env.tools import Tool
  p = StepParser([Tool(name="f", description="d", parameters={"type": "object"},
                       fn=lambda **k: 1)], "response_gen")
  err = p.parse('<think>x</think><tool_call>[{"name": "f", "arguments": {"n": ' + "9" * 5000 +
                '}}]</tool_call>').error
  assert "out of range" in err and "5000 digits" in err and "set_int_max_str_digits" not in err
