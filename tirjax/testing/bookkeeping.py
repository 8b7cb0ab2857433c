"""What an episode runner stored, checked token by token against what a logging sampler
(`scripted_samplers`) sampled and what a fresh environment answers."""

from __future__ import annotations

import numpy as np

from tirjax.env import chat
from tirjax.env.executor import ToolEnv, ToolEnvOptions
from tirjax.env.judge import OUTCOME, rule_verdict
from tirjax.env.parser import ParseLimits
from tirjax.testing.scripted_samplers import sampled_by_context


def check_bookkeeping(batch, tasks, sampler, tokenizer, options) -> None:
  """Every row, token by token, against the sampler's log and a fresh environment."""
  r, s = batch.rollouts, options.shapes
  a = {k: np.asarray(getattr(r, k)) for k in (
      "tokens", "token_valid", "loss_mask", "token_step", "old_logprobs", "num_steps",
      "row_valid", "group_id", "format_reward", "call_valid", "outcome", "answer_score",
      "answered", "policy_version")}
  log = sampled_by_context(sampler)
  env_options = ToolEnvOptions(
      max_steps=options.max_steps, answer_protocol=options.answer_protocol,
      limits=ParseLimits(max_calls=s.max_calls, max_arguments=s.max_params))
  end_ids = set(chat.stop_token_ids(tokenizer))
  assert a["row_valid"].sum() == len(batch.episodes)
  assert not a["token_valid"][~a["row_valid"]].any()
  for rec in batch.episodes:
    b, task = rec.row, tasks[rec.group]
    assert a["group_id"][b] == rec.group
    length = int(a["token_valid"][b].sum())
    assert length == rec.num_tokens <= s.max_tokens
    toks, ts = a["tokens"][b, :length], a["token_step"][b, :length]
    prompt = chat.render_prompt_ids(tokenizer, task, task.question, options.answer_protocol)
    assert toks[:len(prompt)].tolist() == prompt and (ts[:len(prompt)] == -1).all()
    env = ToolEnv(task, env_options)
    pos = len(prompt)
    nsteps = int(a["num_steps"][b])
    assert nsteps == len(rec.results)
    for t in range(nsteps):
      idx = np.flatnonzero(ts == t)
      assert idx.size and idx[0] == pos and np.array_equal(idx, np.arange(pos, pos + idx.size))
      step = toks[pos:pos + idx.size].tolist()
      lp = a["old_logprobs"][b, pos:pos + idx.size]
      assert any(x.tokens == step and np.array_equal(np.asarray(x.logprobs, np.float32), lp)
                 for x in log[tuple(toks[:pos].tolist())]), (
          f"row {b} step {t}: these tokens and log-probs were never sampled from this context")
      assert a["loss_mask"][b, pos:pos + idx.size].all()
      text_ids = step[:-1] if step and step[-1] in end_ids else step
      got = env.step(tokenizer.decode(text_ids, skip_special_tokens=False))
      want = rec.results[t]
      assert got.response_content == want.response_content and got.calls == want.calls
      assert a["format_reward"][b, t] == np.float32(got.format_reward)
      assert a["call_valid"][b, t].sum() == len(got.calls)
      pos += idx.size
      nxt = np.flatnonzero(ts == t + 1)
      stop = nxt[0] if nxt.size else length
      response = toks[pos:stop].tolist()
      assert not a["loss_mask"][b, pos:stop].any() and (ts[pos:stop] == -1).all()
      if t < nsteps - 1:
        assert response == chat.render_tool_response_ids(tokenizer, got.response_content)
      else:
        assert response == []  # nothing follows the last step
      pos = stop
    assert pos == length
    assert rec.status == ("answered" if env.answered else
                          "max_steps" if nsteps == options.max_steps else "truncated")
    if rec.status == "truncated":
      resp = chat.render_tool_response_ids(tokenizer, rec.results[-1].response_content)
      assert length + len(resp) + options.max_new_tokens > s.max_tokens
    verdict = rule_verdict(env.answer, task.answer) if env.answered else "false"
    assert rec.verdict == verdict and a["outcome"][b] == OUTCOME[verdict]
    assert a["answer_score"][b] == float(verdict == "true")
    assert a["answered"][b] == env.answered
    assert a["policy_version"][b] == sampler.policy_version
