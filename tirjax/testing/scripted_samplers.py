"""Test doubles of the `Sampler` protocol for the rollout tests.

* `ScriptedSampler` reads the question and the step index from the prompt ids and emits the
  tokens of that toolworld demo step (`make_demos`), with random corruptions and random early
  answers; per-position entropies follow a function of the step index (ARPO tests).
* `RandomSampler` emits random token ids of random length, ending with `<|im_end|>` or not.
* `TextSampler` emits fixed texts by step index, whatever the task.
* `GuessSampler` answers at once, right or wrong, by a two-answer softmax policy that it
  tempers as samplers do (greedy at T = 0): a policy whose uncertainty is known.

The scripted and the random sampler log every call (`sampled_by_context`), so that tests
compare what the runner stored with what was sampled (`bookkeeping.check_bookkeeping`).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from tirjax.env import chat
from tirjax.sampling.interface import Sample, SamplingParams

USER = f"{chat.IM_START}user\n"


def assistant_steps(demo) -> list[str]:
  return [m["content"] for m in demo.messages if m["role"] == "assistant"]


def corrupt_text(text: str, rng: np.random.Generator) -> str:
  """One of: a character deleted, `</think>` dropped, the JSON cut short, a tool renamed."""
  kind = rng.integers(4)
  if kind == 0 and len(text) > 1:
    i = int(rng.integers(len(text)))
    return text[:i] + text[i + 1:]
  if kind == 1:
    return text.replace("</think>", "", 1)
  if kind == 2:
    return text[:int(rng.integers(1, max(2, len(text))))]
  return text.replace('"name": "', '"name": "x', 1)


def question_and_step(tokenizer, prompt: Sequence[int]) -> tuple[str, int]:
  """The user's question in a prompt's ids, and the index of the step the prompt asks for."""
  text = tokenizer.decode(list(prompt), skip_special_tokens=False)
  start = text.index(USER) + len(USER)
  return (text[start:text.index(chat.IM_END, start)],
          text.count(f"{chat.IM_START}assistant") - 1)


def distinct_questions(tasks: Sequence, n: int) -> list:
  """The first `n` of `tasks` whose questions have not been seen before (names come from fixed
  pools, so two worlds can ask the same question; a scripted policy reads only the prompt)."""
  seen, out = set(), []
  for t in tasks:
    if t.question not in seen:
      seen.add(t.question)
      out.append(t)
  if len(out) < n:
    raise ValueError(f"only {len(out)} distinct questions among {len(tasks)} tasks, need {n}")
  return out[:n]


class ScriptedSampler:
  """Emits toolworld demo steps for the question in the prompt.

  Args:
    tokenizer: the toolworld tokenizer.
    tasks, demos: aligned; the prompt's question selects the pair.
    p_corrupt: probability that a sample is corrupted (`corrupt_text`).
    p_early: probability that a sample answers at once (right or wrong, even chance).
    entropy: per-position entropy as a function of the step index; None: no entropies.
    top_k: with `entropy` None and top_k > 0, give `top_logprobs` of k entries instead.
    answer: replaces the answer of the demo's final step (a function of the task).
  """

  def __init__(self, tokenizer, tasks, demos, p_corrupt: float = 0.0, p_early: float = 0.0,
               entropy: Optional[Callable[[int], float]] = None, top_k: int = 0,
               protocol: str = "response_gen", policy_version: int = 0,
               answer: Optional[Callable] = None):
    self.tokenizer = tokenizer
    self.by_question = {t.question: (t, d) for t, d in zip(tasks, demos)}
    if len(self.by_question) < min(len(tasks), len(demos)):  # a prompt would not tell them apart
      raise ValueError("ScriptedSampler: tasks must have distinct questions (see distinct_questions)")
    self.p_corrupt, self.p_early = p_corrupt, p_early
    self.entropy, self.top_k, self.protocol = entropy, top_k, protocol
    self.policy_version, self.answer = policy_version, answer
    self.end = chat.im_end_id(tokenizer)
    self.calls: list = []  # (prompts, params, outputs)

  def step_of(self, prompt: Sequence[int]):
    """(task, demo, step index) of a prompt."""
    question, step = question_and_step(self.tokenizer, prompt)
    task, demo = self.by_question[question]
    return task, demo, step

  def content(self, prompt, rng: np.random.Generator) -> str:
    task, demo, step = self.step_of(prompt)
    steps = assistant_steps(demo)
    text = steps[min(step, len(steps) - 1)]
    if self.answer is not None and step >= len(steps) - 1:
      text = chat.format_answer_step("Done.", self.answer(task), self.protocol)
    if rng.random() < self.p_early:
      answer = task.answer if rng.random() < 0.5 else "Wrong answer"
      text = chat.format_answer_step("Guess.", answer, self.protocol)
    if rng.random() < self.p_corrupt:
      text = corrupt_text(text, rng)
    return text

  def generate(self, prompts, params: SamplingParams) -> list[list[Sample]]:
    rng = np.random.default_rng(params.seed)
    out = []
    for prompt in prompts:
      step = self.step_of(prompt)[2]
      samples = []
      for _ in range(params.n):
        ids = chat.encode(self.tokenizer, self.content(prompt, rng)) + [self.end]
        reason = "stop"
        if len(ids) > params.max_new_tokens:
          ids, reason = ids[:params.max_new_tokens], "length"
        samples.append(self._sample(ids, reason, step, rng, params))
      out.append(samples)
    self.calls.append(([list(p) for p in prompts], params, out))
    return out

  def _sample(self, ids, reason, step, rng, params) -> Sample:
    entropies = top = None
    if self.entropy is not None:
      entropies = [self.entropy(step)] * len(ids)
    elif self.top_k and params.top_logprobs:
      top = [_top_logprobs(rng, self.top_k, len(self.tokenizer)) for _ in ids]
    return Sample(tokens=ids, logprobs=list(rng.uniform(-5.0, 0.0, len(ids))),
                  finish_reason=reason, policy_version=self.policy_version,
                  entropies=entropies, top_logprobs=top)


def _top_logprobs(rng, k: int, vocab: int) -> dict:
  p = rng.dirichlet(np.ones(k + 1))[:k]  # k of k + 1 shares: not a full distribution
  ids = rng.choice(vocab, size=k, replace=False)
  return {int(i): float(np.log(x)) for i, x in zip(ids, p)}


class TextSampler:
  """Emits `texts[step]` (the last one beyond) for every prompt, whatever the task."""

  def __init__(self, tokenizer, texts: Sequence[str]):
    self.tokenizer, self.texts = tokenizer, list(texts)
    self.end = chat.im_end_id(tokenizer)
    self.policy_version = 0

  def generate(self, prompts, params: SamplingParams) -> list[list[Sample]]:
    out = []
    for prompt in prompts:
      text = self.tokenizer.decode(list(prompt), skip_special_tokens=False)
      step = text.count(f"{chat.IM_START}assistant") - 1
      ids = chat.encode(self.tokenizer, self.texts[min(step, len(self.texts) - 1)]) + [self.end]
      out.append([Sample(ids, [-1.0] * len(ids), "stop") for _ in range(params.n)])
    return out


class GuessSampler:
  """Answers each question at its first step: its task's answer, or `wrong`. A two-answer
  softmax policy with logits (log p, log(1 − p)), p = `p_right`, at temperature 1; at
  temperature T > 0 a sample is right with probability

      p_T = p^(1/T) / (p^(1/T) + (1 − p)^(1/T))

  (the logits divided by T, as the samplers temper), and greedy (T = 0) takes the likelier
  answer. A sample draws from a stream keyed on the call's seed and its row id (or position),
  so that a row's samples do not depend on what else is in the call. `calls` logs the
  sampling parameters of every call."""

  def __init__(self, tokenizer, tasks, p_right: float, wrong: str = "Wrong answer",
               protocol: str = "response_gen"):
    if not 0 < p_right < 1:
      raise ValueError(f"p_right: must lie in (0, 1), got {p_right}")
    self.tokenizer, self.p_right, self.wrong, self.protocol = tokenizer, p_right, wrong, protocol
    self.by_question = {t.question: t for t in tasks}
    if len(self.by_question) < len(tasks):  # a prompt would not tell them apart
      raise ValueError("GuessSampler: tasks must have distinct questions (distinct_questions)")
    self.end = chat.im_end_id(tokenizer)
    self.policy_version = 0
    self.calls: list[SamplingParams] = []

  def p_at(self, temperature: float) -> float:
    """The chance that a sample at `temperature` is right (greedy: 0 or 1)."""
    p = self.p_right
    if temperature == 0:
      return float(p > 0.5)
    a, b = p ** (1 / temperature), (1 - p) ** (1 / temperature)
    return a / (a + b)

  def generate(self, prompts, params: SamplingParams) -> list[list[Sample]]:
    self.calls.append(params)
    p = self.p_at(params.temperature)
    out = []
    for i, prompt in enumerate(prompts):
      question, step = question_and_step(self.tokenizer, prompt)
      if step != 0:
        raise ValueError(f"GuessSampler: answers at the first step, asked for step {step}")
      task = self.by_question[question]
      rng = np.random.default_rng([params.seed, params.row_ids[i] if params.row_ids else i])
      samples = []
      for right in rng.random(params.n) < p:
        text = chat.format_answer_step("Guess.", task.answer if right else self.wrong,
                                       self.protocol)
        ids = chat.encode(self.tokenizer, text) + [self.end]
        reason = "stop" if len(ids) <= params.max_new_tokens else "length"
        ids = ids[:params.max_new_tokens]
        samples.append(Sample(ids, [-1.0] * len(ids), reason))
      out.append(samples)
    return out


class RandomSampler:
  """Random ids (any token of the vocabulary) of random length; ends with `<|im_end|>` with
  probability `p_stop`, else runs to a random length (finish "length" at the limit)."""

  def __init__(self, tokenizer, p_stop: float = 0.5, policy_version: int = 3):
    self.vocab = len(tokenizer)
    self.end = chat.im_end_id(tokenizer)
    self.p_stop, self.policy_version = p_stop, policy_version
    self.calls: list = []

  def generate(self, prompts, params: SamplingParams) -> list[list[Sample]]:
    rng = np.random.default_rng(params.seed)
    out = []
    for _ in prompts:
      samples = []
      for _ in range(params.n):
        n = int(rng.integers(1, params.max_new_tokens + 1))
        ids = [int(x) for x in rng.integers(0, self.vocab, n)]
        ids = [x for x in ids if x not in params.stop_token_ids] or [0]
        stop = rng.random() < self.p_stop and len(ids) < params.max_new_tokens
        ids = ids + [self.end] if stop else ids
        reason = "stop" if stop else "length"
        samples.append(Sample(ids, list(rng.uniform(-8.0, 0.0, len(ids))), reason,
                              self.policy_version,
                              entropies=list(rng.uniform(0, 3, len(ids)))))
      out.append(samples)
    self.calls.append(([list(p) for p in prompts], params, out))
    return out


def sampled_by_context(sampler) -> dict:
  """{prompt ids: [Sample, ...]} over every logged call."""
  out: dict = {}
  for prompts, _, outputs in sampler.calls:
    for prompt, samples in zip(prompts, outputs):
      out.setdefault(tuple(prompt), []).extend(samples)
  return out
