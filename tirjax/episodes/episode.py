"""The episode runner: live rows over the tool environment, advanced by batched sampler calls.

A row is a path of `StepNode`s from the query's prompt. Rows of a tree share the nodes of their
common prefix (the same objects, hence the same tokens). Token-in/token-out (spec §7): a row's
tokens are the prompt ids, then per step the sampler's ids exactly (the end-of-turn token
included) and, if the row goes on, the tool-response ids of `chat.render_tool_response_ids`
(`loss_mask = 0`), or, where a dialogue's step ended a user turn, the next user turn's ids
(`chat.render_user_turn_ids`). Nothing is re-encoded; the step text is decoded only for the
parser.

A row ends answered (terminal tool / `<answer>`), at T_max (`max_steps`), or `truncated` when
its next step could not fit: when length + tool response + `max_new_tokens` > L. The tool
response that would not fit is then not appended (no step follows it).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Optional, Sequence

from tirjax.env import chat
from tirjax.env.executor import ToolEnvOptions, StepResult, ToolEnv
from tirjax.env.parser import ParseLimits, StepParser
from tirjax.env.tools import Task, agent_tools
from tirjax.episodes.options import RolloutOptions
from tirjax.sampling.interface import Sample, Sampler, SamplingParams

ACTIVE, ANSWERED, MAX_STEPS, TRUNCATED = "active", "answered", "max_steps", "truncated"
# Per-phase counters a sampler may keep (`JaxSampler.counters`), added to the rollout's stats.
SAMPLER_COUNTERS = ("prefill_tokens", "prefill_s", "decode_tokens", "decode_s", "continued_rows",
                    "prefilled_rows")


@dataclasses.dataclass(eq=False)
class StepNode:
  """One executed step: a tree node. `uid` is unique within a rollout call."""

  uid: int
  depth: int  # the step index t (0-based)
  parent: Optional["StepNode"]
  tokens: list  # sampled ids, the stop token included
  logprobs: list
  policy_version: int
  text: str  # what the parser saw: the decoded ids without a final stop token
  result: StepResult
  response: list  # tool-response ids appended after the step; [] when the row ends here
  entropy: Optional[float] = None  # ARPO's entropy score of the step


STREAMS_PER_QUERY = 4096  # episodes one query may make in a rollout (tree forks included)


@dataclasses.dataclass(eq=False)
class Episode:
  """A live or finished row."""

  eid: int
  query: int
  env: Optional[ToolEnv]
  steps: list  # [StepNode], the path from the root
  length: int  # tokens so far
  status: str = ACTIVE
  entropy_ref: Optional[float] = None  # ARPO: the score of the row's first own step
  stream: int = 0  # its samples' random stream (`SamplingParams.row_ids`), see `EpisodeRunner`


@dataclasses.dataclass(frozen=True)
class Candidate:
  """A sampled, not yet executed continuation of an episode."""

  uid: int
  parent: Episode
  sample: Sample


class EpisodeRunner:
  """Holds what the rows of one batch share: tasks, prompts, parsers, the sampler, counters."""

  def __init__(self, sampler: Sampler, tokenizer, tasks: Sequence[Task],
               options: RolloutOptions, first_query: int = 0):
    """`first_query`: the batch-wide index of `tasks[0]` (a process's share of a step's
    queries starts there). Each episode draws its samples from a stream named by its query's
    batch-wide index and the order in which the query's episodes were made, so a row gets the
    same tokens whichever process samples it and whatever else shares the sampler call."""
    s = options.shapes
    self.sampler, self.tokenizer, self.tasks, self.options = sampler, tokenizer, tasks, options
    self.env_options = ToolEnvOptions(
        max_steps=options.max_steps, answer_protocol=options.answer_protocol,
        limits=ParseLimits(max_calls=s.max_calls, max_arguments=s.max_params),
        solve_scoring=options.solve_scoring)
    for task in tasks:
      check_task_fits(task, options)
    self.parsers = [StepParser(agent_tools(t, options.answer_protocol),
                               options.answer_protocol, self.env_options.limits) for t in tasks]
    self.prompts = [chat.render_prompt_ids(tokenizer, t, t.question, options.answer_protocol)
                    for t in tasks]
    for task, prompt in zip(tasks, self.prompts):
      if len(prompt) + options.max_new_tokens > s.max_tokens:
        raise ValueError(f"shapes.max_tokens={s.max_tokens} cannot hold the prompt of task "
                         f"{task.task_id} ({len(prompt)} tokens) and one step of "
                         f"max_new_tokens={options.max_new_tokens}")
    self.stop_ids = tuple(chat.stop_token_ids(tokenizer))
    self.vocab_size = len(tokenizer)
    self._uid = 0
    self._eid = 0
    self.first_query = first_query
    self._made = [0] * len(tasks)  # episodes made per query (their streams)
    self.stats = dict(sampler_calls=0, prompts=0, sampled_tokens=0, sampler_s=0.0, env_s=0.0,
                      replayed_steps=0, **{k: 0 for k in SAMPLER_COUNTERS})

  # -- rows --------------------------------------------------------------------------------

  def start(self, query: int) -> Episode:
    env = ToolEnv(self.tasks[query], self.env_options, self.parsers[query])
    return Episode(self._next_eid(), query, env, [], len(self.prompts[query]),
                   stream=self._next_stream(query))

  def root(self, query: int) -> Episode:
    """The query's empty row without an environment: only sampled from, never extended."""
    return Episode(self._next_eid(), query, None, [], len(self.prompts[query]),
                   stream=self._next_stream(query))

  def context(self, ep: Episode) -> list[int]:
    """The token ids the next step is sampled from."""
    ids = list(self.prompts[ep.query])
    for node in ep.steps:
      ids += node.tokens
      ids += node.response
    return ids

  def fork(self, ep: Episode) -> Episode:
    """An independent copy of an active row: shared nodes, its own environment, rebuilt by
    replaying the row's step texts (tools are re-run; deterministic tools give the same
    state, and the row keeps the tokens already sampled either way)."""
    if ep.status != ACTIVE:
      raise ValueError(f"fork: episode {ep.eid} has ended ({ep.status})")
    t0 = time.perf_counter()
    env = ToolEnv(self.tasks[ep.query], self.env_options, self.parsers[ep.query])
    for node in ep.steps:
      env.step(node.text)
    self.stats["replayed_steps"] += len(ep.steps)
    self.stats["env_s"] += time.perf_counter() - t0
    return Episode(self._next_eid(), ep.query, env, list(ep.steps), ep.length,
                   stream=self._next_stream(ep.query))

  def drop(self, ep: Episode) -> None:
    """Releases a row that will not be continued nor trained on."""
    if ep.env is not None:
      ep.env.close()
      ep.env = None

  # -- sampling ----------------------------------------------------------------------------

  def sample(self, episodes: Sequence[Episode], n: int, seed: int,
             top_logprobs: int = 0) -> list[list[Candidate]]:
    """One sampler call for all `episodes`: `n` candidates each."""
    if not episodes:
      return []
    o = self.options
    params = SamplingParams(n=n, temperature=o.temperature, top_p=o.top_p,
                            max_new_tokens=o.max_new_tokens, stop_token_ids=self.stop_ids,
                            seed=seed, top_logprobs=top_logprobs,
                            row_ids=tuple(ep.stream for ep in episodes),
                            logprob_temperature=o.logprob_temperature)
    prompts = [self.context(ep) for ep in episodes]
    before = dict(getattr(self.sampler, "counters", {}))
    t0 = time.perf_counter()
    out = self.sampler.generate(prompts, params)
    self.stats["sampler_s"] += time.perf_counter() - t0
    after = getattr(self.sampler, "counters", {})
    for k in SAMPLER_COUNTERS:  # the sampler's own breakdown, where it keeps one
      if k in after:
        self.stats[k] += after[k] - before.get(k, 0)
    self.stats["sampler_calls"] += 1
    self.stats["prompts"] += len(prompts)
    if len(out) != len(prompts):
      raise ValueError(f"sampler: returned {len(out)} results for {len(prompts)} prompts")
    result = []
    for ep, samples in zip(episodes, out):
      if len(samples) != n:
        raise ValueError(f"sampler: returned {len(samples)} samples for a prompt, expected n={n}")
      for s in samples:
        self._check_sample(s, top_logprobs)
        self.stats["sampled_tokens"] += len(s.tokens)
      result.append([Candidate(self._next_uid(), ep, s) for s in samples])
    return result

  def _check_sample(self, s: Sample, top_logprobs: int) -> None:
    if not s.tokens:
      raise ValueError("sampler: returned a sample without tokens")
    if len(s.logprobs) != len(s.tokens):
      raise ValueError(f"sampler: {len(s.tokens)} tokens but {len(s.logprobs)} log-probs")
    if len(s.tokens) > self.options.max_new_tokens:
      raise ValueError(f"sampler: {len(s.tokens)} tokens exceed max_new_tokens="
                       f"{self.options.max_new_tokens}")
    if top_logprobs and s.entropies is None and s.top_logprobs is None:
      raise ValueError("sampler: ARPO needs per-position entropies or top log-probs; the "
                       "sample has neither")

  # -- execution ---------------------------------------------------------------------------

  def extend(self, ep: Episode, cand: Candidate, entropy: Optional[float] = None) -> Episode:
    """Executes the candidate step in `ep`'s environment and appends it to `ep`."""
    if ep.status != ACTIVE or ep.env is None:
      raise ValueError(f"extend: episode {ep.eid} has ended ({ep.status})")
    s = cand.sample
    ids = s.tokens[:-1] if s.tokens and s.tokens[-1] in self.stop_ids else s.tokens
    text = self.tokenizer.decode(ids, skip_special_tokens=False)
    t0 = time.perf_counter()
    result = ep.env.step(text)
    self.stats["env_s"] += time.perf_counter() - t0
    ep.length += len(s.tokens)
    response: list[int] = []
    if result.done:
      ep.status = ANSWERED if result.answered else MAX_STEPS
    else:
      ids = (chat.render_tool_response_ids(self.tokenizer, result.response_content)
             if result.user_message is None
             else chat.render_user_turn_ids(self.tokenizer, result.user_message))
      if ep.length + len(ids) + self.options.max_new_tokens > self.options.shapes.max_tokens:
        ep.status = TRUNCATED
      else:
        response = ids
        ep.length += len(ids)
    ep.steps.append(StepNode(
        uid=cand.uid, depth=len(ep.steps), parent=ep.steps[-1] if ep.steps else None,
        tokens=list(s.tokens), logprobs=[float(x) for x in s.logprobs],
        policy_version=int(s.policy_version), text=text, result=result, response=response,
        entropy=entropy))
    if ep.status != ACTIVE:
      self.drop(ep)
    return ep

  def _next_uid(self) -> int:
    self._uid += 1
    return self._uid - 1

  def _next_eid(self) -> int:
    self._eid += 1
    return self._eid - 1

  def _next_stream(self, query: int) -> int:
    made = self._made[query]
    if made >= STREAMS_PER_QUERY:
      raise ValueError(f"query {query}: more than {STREAMS_PER_QUERY} episodes in one rollout")
    self._made[query] += 1
    return (self.first_query + query) * STREAMS_PER_QUERY + made


def check_task_fits(task: Task, options: RolloutOptions) -> None:
  """Raises a ValueError naming the task when its ground truth does not fit C or P."""
  s = options.shapes
  gt = task.flat_gt_calls
  if len(gt) > s.max_gt_calls:
    raise ValueError(f"task {task.task_id}: {len(gt)} ground-truth calls exceed "
                     f"shapes.max_gt_calls={s.max_gt_calls}")
  for call in gt:
    if len(call.get("arguments") or {}) > s.max_params:
      raise ValueError(f"task {task.task_id}: ground-truth call {call.get('name')!r} has "
                       f"{len(call['arguments'])} arguments; shapes.max_params={s.max_params}")
