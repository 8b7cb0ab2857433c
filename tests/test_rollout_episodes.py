"""The episode runner: token bookkeeping, truncation, judging, toolworld end to end, errors."""

import dataclasses
import json

import numpy as np
import pytest

from tirjax.env import chat, metrics
from tirjax.env.judge import Judgement
from tirjax.env.tools import UNABLE_TO_ANSWER
from tirjax.config import config_from_dataclass, dataclass_from_config
from tirjax.env.toolworld import (DemoOptions, Difficulty, make_demos,
                                  make_tasks)
from tirjax.episodes import ArpoOptions, RolloutOptions, Shapes, judging, rollout
from tirjax.episodes.options import TreeOptions
from tirjax.sampling.interface import Sample
from tirjax.testing.bookkeeping import check_bookkeeping
from tirjax.testing.scripted_samplers import (RandomSampler, ScriptedSampler, TextSampler,
                                              assistant_steps, distinct_questions)
from tirjax.testing.short_runs import short_config
from tirjax.trainer import resolve

# One padded shape for the whole file: call_similarity compiles once.
SHAPES = Shapes(num_rows=64, max_steps=10, max_calls=4, max_gt_calls=8, max_tokens=1024,
                max_params=4)


def options(**kw) -> RolloutOptions:
  kw.setdefault("max_new_tokens", 160)
  return RolloutOptions(shapes=kw.pop("shapes", SHAPES), **kw)


@pytest.fixture(scope="module")
def tasks():
  return distinct_questions(make_tasks("train", 320, seed=4, difficulty=Difficulty(
      hop_weights=(1, 1, 1, 1), p_down=0.25)), 192)


@pytest.fixture(scope="module")
def demos(tasks):
  return make_demos(tasks, seed=0)


@pytest.mark.parametrize("mode,n", [("independent", 4), ("tree", 4), ("arpo", 0)])
@pytest.mark.parametrize("seed", [0, 1])
def test_rows_are_prompt_sampled_tokens_and_tool_responses(tokenizer, tasks, demos, mode, n,
                                                           seed):
  sampler = ScriptedSampler(tokenizer, tasks, demos, p_corrupt=0.3, p_early=0.15,
                            entropy=lambda t: 0.3 * t, policy_version=7)
  opts = options(mode=mode, n=max(n, 1), max_steps=6, seed=seed,
                 arpo=ArpoOptions(initial_rollouts=2, total_rollouts=4))
  batch = rollout(sampler, tokenizer, tasks[8 * seed:8 * seed + 8], opts)
  check_bookkeeping(batch, tasks[8 * seed:8 * seed + 8], sampler, tokenizer, opts)
  counts = np.bincount(np.asarray(batch.rollouts.group_id)[np.asarray(batch.rollouts.row_valid)])
  assert counts.tolist() == [opts.rows_per_query] * 8


@pytest.mark.parametrize("max_tokens", [400, 520, 700])
def test_random_tokens_truncate_rows_that_cannot_fit_their_next_step(tokenizer, tasks,
                                                                     max_tokens):
  sampler = RandomSampler(tokenizer, p_stop=0.5)
  opts = options(mode="tree", n=4, max_new_tokens=96, shapes=dataclasses.replace(
      SHAPES, max_tokens=max_tokens))
  batch = rollout(sampler, tokenizer, tasks[:6], opts)
  check_bookkeeping(batch, tasks[:6], sampler, tokenizer, opts)
  statuses = {e.status for e in batch.episodes}
  assert "truncated" in statuses and statuses <= {"truncated", "max_steps", "answered"}
  assert all(e.outcome == -1 for e in batch.episodes if e.status != "answered")


def test_every_demo_reaches_its_answer_through_the_runner(tokenizer, tasks, demos):
  sampler = ScriptedSampler(tokenizer, tasks, demos)
  opts = options(n=1, max_steps=SHAPES.max_steps)  # the longest demo has 9 steps
  assert max(len(assistant_steps(d)) for d in demos) <= opts.max_steps
  for start in range(0, len(tasks), SHAPES.num_rows):
    chunk = tasks[start:start + SHAPES.num_rows]
    batch = rollout(sampler, tokenizer, chunk, opts)
    for rec, task, demo in zip(batch.episodes, chunk, demos[start:]):
      down = task.metadata["down"] is not None
      want = (UNABLE_TO_ANSWER, 0.0) if down else ("true", 1.0)  # a down tool: verdict unable
      assert rec.status == "answered" and (rec.verdict, rec.outcome) == want
      assert rec.answer == task.answer == demo.answer
      assert rec.texts == assistant_steps(demo)
      responses = [m["content"] for m in demo.messages if m["role"] == "tool"]
      assert [r.response_content for r in rec.results[:-1]] == responses
      clean = demo.kind != "recover" and task.metadata["down"] is None  # no tool error
      assert all(r.format_reward == 0.25 for r in rec.results) == clean
    r = batch.rollouts
    up = [float(t.metadata["down"] is None) for t in chunk]
    assert np.asarray(r.answer_score)[:len(chunk)].tolist() == up
    m = metrics.portool_metrics([e.summary for e in batch.episodes],
                                [e.outcome for e in batch.episodes], step_cap=opts.max_steps)
    assert m["accuracy"] == np.mean(up) and m["unanswerable_rate"] == 0.0
    assert m["avg_tool_steps"] == np.mean([len(e.texts) for e in batch.episodes])


def test_wrong_answers_are_false(tokenizer, tasks, demos):
  up = [t for t in tasks if t.metadata["down"] is None][:16]
  sampler = ScriptedSampler(tokenizer, tasks, demos, answer=lambda task: "Nowhere at all")
  batch = rollout(sampler, tokenizer, up, options(n=2))
  assert {(e.verdict, e.outcome) for e in batch.episodes} == {("false", -1.0)}
  assert not np.asarray(batch.rollouts.answer_score).any()


def test_down_queries_abstained_on_earn_unable_to_answer_only_where_unanswerable(tokenizer, tasks, demos):
  down = [t for t in tasks if t.metadata["down"] is not None][:16]
  assert len(down) == 16
  sampler = ScriptedSampler(tokenizer, tasks, demos)
  # toolworld's reference of a down query is unable_to_answer: saying so gets that verdict
  # (PORTool: a reasonable strategy that the tools could not complete), R_out = 0.
  batch = rollout(sampler, tokenizer, down, options(n=1))
  assert {(e.answer, e.verdict, e.outcome) for e in batch.episodes} == {
      (UNABLE_TO_ANSWER, UNABLE_TO_ANSWER, 0.0)}
  # Judged against the answer the query has when every tool is up (an answerable task), the
  # same abstentions are false: -1 (spec §6: abstaining is earned only where no answer exists).
  real = [dataclasses.replace(t, answer=t.metadata["answer_if_up"]) for t in down]
  batch = rollout(sampler, tokenizer, real, options(n=1))
  assert {(e.verdict, e.outcome) for e in batch.episodes} == {("false", -1.0)}
  r = batch.rollouts
  assert np.asarray(r.outcome)[:16].tolist() == [-1.0] * 16
  assert np.asarray(r.answered)[:16].all() and not np.asarray(r.answer_score).any()


@pytest.mark.parametrize("abstention, verdict, outcome", [("earned", "false", -1.0),
                                                       ("claimed", UNABLE_TO_ANSWER, 0.0)])
def test_judge_abstention_setting_reaches_the_episodes_verdicts(tokenizer, tasks, demos,
                                                                abstention, verdict, outcome):
  """Issue 42: `judge.abstention` from the config, through the judge the trainer builds
  (`judging.make_judge` of the resolved `judge` section), to the episodes' verdicts and
  rewards: abstaining on an answerable task is false under "earned" (spec §6) and
  unable_to_answer (R_out = 0) under "claimed"."""
  config = short_config("grpo", **{"judge.abstention": abstention})
  judge = judging.make_judge(resolve.resolve(config).judge)
  down = [t for t in tasks if t.metadata["down"] is not None][:8]
  real = [dataclasses.replace(t, answer=t.metadata["answer_if_up"]) for t in down]
  batch = rollout(ScriptedSampler(tokenizer, tasks, demos), tokenizer, real, options(n=1),
                  judge=judge)
  assert {(e.answer, e.verdict, e.outcome) for e in batch.episodes} == {
      (UNABLE_TO_ANSWER, verdict, outcome)}
  assert np.asarray(batch.rollouts.outcome)[:len(real)].tolist() == [outcome] * len(real)


def test_unfinished_rows_get_minus_one_without_a_judge_call(tokenizer, tasks):
  seen = []

  def judge(trajectory):
    seen.append(trajectory)
    return Judgement("true", ("true",) * 5, "majority")

  look = '<think>Look.</think><tool_call>[{"name": "city_info", "arguments": ' \
         '{"name": "Nowhere", "field": "temp_c"}}]</tool_call>'
  batch = rollout(TextSampler(tokenizer, [look]), tokenizer, tasks[:3],
                  options(n=2, max_steps=3), judge=judge)
  assert not seen and {(e.status, e.verdict) for e in batch.episodes} == {("max_steps", "false")}
  answer = chat.format_answer_step("Done.", "42")
  batch = rollout(TextSampler(tokenizer, [look, answer]), tokenizer, tasks[:3],
                  options(n=2, max_steps=3, judge_workers=3), judge=judge)
  assert len(seen) == 6 and all(e.judgement.votes == ("true",) * 5 for e in batch.episodes)
  assert [s.steps[0][0] for s in seen] == [look] * 6 and seen[0].answer == "42"
  assert np.asarray(batch.rollouts.outcome)[:6].tolist() == [1.0] * 6


def test_a_judge_with_an_unknown_verdict_is_an_error(tokenizer, tasks):
  answer = chat.format_answer_step("Done.", "42")
  with pytest.raises(ValueError, match="judge: returned 'maybe'"):
    rollout(TextSampler(tokenizer, [answer]), tokenizer, tasks[:1], options(n=1),
            judge=lambda traj: "maybe")


def _calls(n_calls, n_args):
  return [{"name": "calculate", "arguments": {f"a{i}": i for i in range(n_args)}}] * n_calls


def test_over_long_steps_are_explicit_errors_to_the_agent(tokenizer, tasks):
  too_many = chat.format_step("Many.", _calls(SHAPES.max_calls + 1, 1))
  too_wide = chat.format_step("Wide.", _calls(1, SHAPES.max_params + 1))
  batch = rollout(TextSampler(tokenizer, [too_many, too_wide]), tokenizer, tasks[:1],
                  options(n=1, max_steps=2))
  (rec,) = batch.episodes
  errors = [json.loads(r.response_content)[0]["error"] for r in rec.results]
  assert f"the limit is {SHAPES.max_calls}" in errors[0]
  assert f"the limit is {SHAPES.max_params}" in errors[1]
  assert [r.checks_passed for r in rec.results] == [2, 2]
  assert not np.asarray(batch.rollouts.call_valid).any()


def test_sizes_that_do_not_fit_are_rejected_by_name(tokenizer, tasks):
  big = max(tasks, key=lambda t: len(t.flat_gt_calls))
  small_c = options(n=1, shapes=dataclasses.replace(SHAPES, max_gt_calls=1))
  with pytest.raises(ValueError, match=f"task {big.task_id}: .*max_gt_calls=1"):
    rollout(TextSampler(tokenizer, ["x"]), tokenizer, [big], small_c)
  wide = max(tasks, key=lambda t: max(len(c["arguments"]) for c in t.flat_gt_calls))
  small_p = options(n=1, shapes=dataclasses.replace(SHAPES, max_params=1))
  with pytest.raises(ValueError, match="max_params=1"):
    rollout(TextSampler(tokenizer, ["x"]), tokenizer, [wide], small_p)
  with pytest.raises(ValueError, match="num_rows=64 is too small for 9 tasks"):
    rollout(TextSampler(tokenizer, ["x"]), tokenizer, tasks[:9], options(n=8))
  short = options(n=1, max_new_tokens=100, shapes=dataclasses.replace(SHAPES, max_tokens=150))
  with pytest.raises(ValueError, match="cannot hold the prompt of task"):
    rollout(TextSampler(tokenizer, ["x"]), tokenizer, tasks[:1], short)


class _Overlong:
  policy_version = 0

  def generate(self, prompts, params):
    return [[Sample([1] * (params.max_new_tokens + 1), [0.0] * (params.max_new_tokens + 1),
                    "length")] * params.n for _ in prompts]


def test_a_sampler_that_breaks_the_protocol_is_an_error(tokenizer, tasks):
  with pytest.raises(ValueError, match="exceed max_new_tokens"):
    rollout(_Overlong(), tokenizer, tasks[:1], options(n=1))
  with pytest.raises(ValueError, match="neither"):
    rollout(ScriptedSampler(tokenizer, tasks, make_demos(tasks[:1])), tokenizer, tasks[:1],
            options(mode="arpo", arpo=ArpoOptions(initial_rollouts=1, total_rollouts=2)))


@pytest.mark.parametrize("bad,match", [
    (dict(mode="beam"), "mode"), (dict(n=0), "n: must be >= 1"),
    (dict(max_steps=11), "exceeds shapes.max_steps"), (dict(top_p=0.0), "top_p"),
    (dict(max_new_tokens=1024), "leaves no room"), (dict(answer_protocol="xml"), "answer_protocol"),
])
def test_invalid_options_name_the_option(bad, match):
  with pytest.raises(ValueError, match=match):
    options(**bad)


def test_invalid_mode_options_name_the_option():
  with pytest.raises(ValueError, match="initial_rollouts"):
    ArpoOptions(initial_rollouts=9, total_rollouts=8)
  with pytest.raises(ValueError, match="branch_factor"):
    TreeOptions(branch_factor=0)


def test_same_seed_same_batch(tokenizer, tasks, demos):
  def run(seed):
    sampler = ScriptedSampler(tokenizer, tasks, demos, p_corrupt=0.3, p_early=0.2,
                              entropy=lambda t: float(t))
    return rollout(sampler, tokenizer, tasks[:4], options(mode="tree", n=4, seed=seed))

  a, b, c = run(3), run(3), run(4)
  assert np.array_equal(a.rollouts.tokens, b.rollouts.tokens)
  assert np.array_equal(a.rollouts.node_id, b.rollouts.node_id)
  assert not np.array_equal(a.rollouts.tokens, c.rollouts.tokens)


def test_answer_tag_episodes_end_on_the_answer_block(tokenizer, tasks):
  chunk = tasks[:16]
  demos = make_demos(chunk, seed=0, options=DemoOptions(answer_protocol="answer_tag"))
  sampler = ScriptedSampler(tokenizer, chunk, demos, protocol="answer_tag")
  opts = options(n=1, max_steps=SHAPES.max_steps, answer_protocol="answer_tag")
  batch = rollout(sampler, tokenizer, chunk, opts)
  check_bookkeeping(batch, chunk, sampler, tokenizer, opts)
  want = {t.task_id: UNABLE_TO_ANSWER if t.metadata["down"] else "true" for t in chunk}
  assert all(e.verdict == want[e.task_id] and e.texts[-1].endswith("</answer>")
             for e in batch.episodes)


def test_options_round_trip_through_a_config_section():
  opts = options(mode="arpo", arpo=ArpoOptions(beam_size=3), tree=TreeOptions(branch_factor=3))
  section = config_from_dataclass(opts)
  assert section.arpo.beam_size == 3 and section.shapes.max_tokens == SHAPES.max_tokens
  assert dataclass_from_config(RolloutOptions, section) == opts
  section.tree.branch_factor = 0
  with pytest.raises(ValueError, match="tree: branch_factor: must be >= 1"):
    dataclass_from_config(RolloutOptions, section)


def test_greedy_baseline_is_one_judged_greedy_episode_per_query_outside_the_batch(
    tokenizer, tasks, demos):
  """ReMax (spec §4.4): every row of a query carries the R_out of one greedy episode of that
  query; that episode is no row of the batch, and the batch's own rows are unchanged."""
  chunk = tasks[:6]
  wrong = {t.task_id for t in chunk[::2]}  # the policy's demos answer these wrongly

  class Greedy(ScriptedSampler):
    """At temperature 0 a deterministic policy: the demo steps, never a corruption or guess."""

    def generate(self, prompts, params):
      if params.temperature > 0:
        return super().generate(prompts, params)
      saved, (self.p_corrupt, self.p_early) = (self.p_corrupt, self.p_early), (0.0, 0.0)
      try:
        return super().generate(prompts, params)
      finally:
        self.p_corrupt, self.p_early = saved

  def make():
    return Greedy(tokenizer, chunk, demos[:6], p_corrupt=0.2, p_early=0.3,
                  answer=lambda t: "nope" if t.task_id in wrong else t.answer)

  sampler = make()
  opts = options(mode="tree", n=4, seed=2, greedy_baseline=True)
  batch = rollout(sampler, tokenizer, chunk, opts)
  plain = rollout(make(), tokenizer, chunk, dataclasses.replace(opts, greedy_baseline=False))
  r = batch.rollouts
  assert plain.rollouts.greedy_outcome is None
  assert np.array_equal(r.tokens, plain.rollouts.tokens) and len(batch.episodes) == 6 * 4
  greedy_calls = [(p, params) for p, params, _ in sampler.calls if params.temperature == 0]
  assert greedy_calls and all(params.n == 1 for _, params in greedy_calls)
  assert len(greedy_calls[0][0]) == len(chunk)  # first steps: one prompt per query
  alone = rollout(make(), tokenizer, chunk, dataclasses.replace(
      opts, mode="independent", n=1, temperature=0.0, greedy_baseline=False))
  want = {e.group: e.outcome for e in alone.episodes}
  assert all(want[q] == -1.0 for q, t in enumerate(chunk) if t.task_id in wrong)
  gid, valid, got = (np.asarray(x) for x in (r.group_id, r.row_valid, r.greedy_outcome))
  assert all(got[b] == want[gid[b]] for b in np.flatnonzero(valid))
  assert len(set(want.values())) > 1


def test_anchor_states_follow_tool_calls_and_responses_not_text(tokenizer, tasks, demos):
  """state_id (GiGPO): two steps of a query share a state iff the rows' earlier steps made the
  same parsed calls and got the same tool responses, whatever the policy wrote around them."""
  sampler = ScriptedSampler(tokenizer, tasks[:8], demos[:8], p_corrupt=0.3, p_early=0.2)
  batch = rollout(sampler, tokenizer, tasks[:8], options(mode="independent", n=4, seed=1))
  sid = np.asarray(batch.rollouts.state_id)
  history = {}
  for rec in batch.episodes:
    seen = ()
    for t, result in enumerate(rec.results):
      history[(rec.row, t)] = (rec.group, seen)
      seen += ((json.dumps(result.calls, sort_keys=True), result.response_content,
                result.user_message),)
  keys = list(history)
  same_state = [[sid[a] == sid[b] for b in keys] for a in keys]
  same_history = [[history[a] == history[b] for b in keys] for a in keys]
  assert same_state == same_history
  nodes = np.asarray(batch.rollouts.node_id)
  assert any(sid[a] == sid[b] and nodes[a] != nodes[b] for a in keys for b in keys)
