"""IGPO's answer probes (spec §4.4): log P(gold answer | history before each step), one packed
forward per batch, each row a trunk and each of its probes a branch off it.

    probe = AnswerProbe(graphdef, place, step_opts)
    prefix, answers = answer_ids(tokenizer, gold_answers, answer_protocol)   # per row
    rollouts = rollouts.replace(answer_logprob=probe(params, rollouts, prefix, answers))

Probe t of row b is the row's tokens before step t's first generated token (the prompt, steps
0..t-1 and their tool responses, ending in the generation prompt `<|im_start|>assistant\\n`),
then the answer template of the run's protocol (`<think></think><answer>` or the start of a
`response_gen` call, up to its answer string), then the gold answer's tokens; its value is the
mean log-prob of the gold answer's tokens (the paper's 1/|a| normalisation). The probes of a
row share its trunk token for token, and the probes of a query group share its prompt, so
`forest.build` (the trie of the sequences) lays a group's probes out as one forest in which
every history token appears once: the packed forward (`packed.PackedLogprobs`, tree attention)
scores all of a row's turns in one pass, not one forward per turn. Each probe's log-probs are
exactly those of the probe as a dense sequence of its own (`tests/test_answer_probe.py`).

Choices (the paper's template is its own prompt's, not given): the template is the protocol's
answer prefix with an empty `<think></think>` (the policy's own answer step without a
thought); the template and the answer are tokenised separately and concatenated, so the
answer's tokens are the same in every probe whatever the template's last token; the
`response_gen` answer is JSON-escaped, as the policy writes it inside the call; parameters are
the ones the batch was sampled with (the probes are taken before the update), at the policy
step's temperature (`step.temperature`, 1 by default), as the update's own log-probs. A step without a
generated token starts where the next token after its predecessors' would: its probe is the
history up to the step's end (its tool response included).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Optional, Sequence

import jax.numpy as jnp
import numpy as np
from flax import nnx

from tirjax.env import chat
from tirjax.rollouts import Rollouts
from tirjax.train_steps.packed import PackedLogprobs
from tirjax.train_steps.step import Placement, StepOptions

_MARK = "@@IGPO_ANSWER@@"  # stands for the answer in the protocol's answer step


def answer_template(answer_protocol: str) -> str:
  """The text of the protocol's answer step before the answer itself (module docstring)."""
  return chat.format_answer_step("", _MARK, answer_protocol).split(_MARK)[0]


def answer_text(answer: str, answer_protocol: str) -> str:
  """The answer as the protocol's answer step writes it (JSON-escaped inside a call)."""
  return json.dumps(answer, ensure_ascii=False)[1:-1] if answer_protocol == "response_gen" \
      else answer


def answer_ids(tokenizer, answers: Sequence[Optional[str]], answer_protocol: str
               ) -> tuple[list, list]:
  """Per row, the template's and the gold answer's token ids (None for a row without one:
  padding, or a task without a gold answer, which the probe pass refuses if it has steps)."""
  prefix = chat.encode(tokenizer, answer_template(answer_protocol))
  gold = []
  for k, a in enumerate(answers):
    if a is None:
      gold.append(None)
      continue
    ids = chat.encode(tokenizer, answer_text(a, answer_protocol))
    if not ids:
      raise ValueError(f"answers: row {k}'s gold answer {a!r} has no tokens")
    gold.append(ids)
  return [prefix if g is not None else None for g in gold], gold


def probe_starts(token_step: np.ndarray, loss_mask: np.ndarray, token_valid: np.ndarray,
                 num_steps: np.ndarray) -> np.ndarray:
  """[B, T] where the history before step t ends: the index of step t's first generated
  token (a token-less step: where the next step's history begins, else the row's end); -1 on
  padding steps."""
  B, L = token_step.shape
  T = int(np.max(num_steps, initial=0))
  first = np.full((B, max(T, 1)), L, np.int64)
  rows, cols = np.nonzero(loss_mask & (token_step >= 0) & (token_step < T))
  np.minimum.at(first, (rows, token_step[rows, cols]), cols)  # each step's first token
  first[first == L] = -1
  length = token_valid.sum(axis=1)
  for b in range(B):  # token-less steps, from the last one back
    nxt = int(length[b])
    for t in range(int(num_steps[b]) - 1, -1, -1):
      if first[b, t] < 0:
        first[b, t] = nxt
      nxt = first[b, t]
  return first


@dataclasses.dataclass(frozen=True)
class Probes:
  """The probe sequences of a batch: tokens, valid, needed [P, Lp]; row, step, group [P]."""

  tokens: np.ndarray
  valid: np.ndarray
  needed: np.ndarray
  row: np.ndarray
  step: np.ndarray
  group: np.ndarray


def probe_sequences(r: Rollouts, prefix: Sequence, gold: Sequence, multiple: int = 1) -> Probes:
  """One probe per valid step of each valid row (module docstring); P padded with empty
  probes to a multiple of `multiple` (the batch shards)."""
  tokens, valid = np.asarray(r.tokens), np.asarray(r.token_valid, bool)
  num_steps = np.where(np.asarray(r.row_valid, bool), np.asarray(r.num_steps), 0)
  starts = probe_starts(np.asarray(r.token_step), np.asarray(r.loss_mask, bool), valid,
                        num_steps)
  if len(prefix) != r.num_rows or len(gold) != r.num_rows:
    raise ValueError(f"answers: {len(gold)} gold answers for {r.num_rows} rows")
  seqs, needs, rows, steps = [], [], [], []
  for b in range(r.num_rows):
    if num_steps[b] == 0:
      continue
    if gold[b] is None:
      raise ValueError(f"answers: row {b} has steps but no gold answer (IGPO needs one per "
                       "task: an environment whose tasks have answers)")
    for t in range(int(num_steps[b])):
      history = tokens[b, :starts[b, t]]
      seqs.append(np.concatenate([history, prefix[b], gold[b]]).astype(np.int32))
      needs.append(np.arange(len(seqs[-1])) >= len(history) + len(prefix[b]))
      rows.append(b)
      steps.append(t)
  count = -(-max(len(seqs), 1) // multiple) * multiple
  width = max([len(s) for s in seqs] + [1])
  out = Probes(tokens=np.zeros((count, width), np.int32), valid=np.zeros((count, width), bool),
               needed=np.zeros((count, width), bool), row=np.full(count, -1, np.int64),
               step=np.full(count, -1, np.int64), group=np.zeros(count, np.int32))
  group_id = np.asarray(r.group_id)
  for p, (s, n, b, t) in enumerate(zip(seqs, needs, rows, steps)):
    out.tokens[p, :len(s)], out.valid[p, :len(s)], out.needed[p, :len(s)] = s, True, n
    out.row[p], out.step[p], out.group[p] = b, t, group_id[b]
  return out


def scatter_means(logp: np.ndarray, probes: Probes, shape: tuple[int, int]) -> np.ndarray:
  """[B, T] the mean log-prob of each probe's needed tokens at its (row, step); 0 elsewhere."""
  mean = (np.where(probes.needed, logp, 0.0).sum(axis=1)
          / np.maximum(probes.needed.sum(axis=1), 1))
  out = np.zeros(shape, np.float32)
  live = probes.row >= 0
  out[probes.row[live], probes.step[live]] = mean[live]
  return np.minimum(out, 0.0)  # a mean of log-probs is ≤ 0; rounding may not say so


class AnswerProbe:
  """`(params, rollouts, prefix, gold) -> [B, T]` `answer_logprob` (module docstring), by one
  packed log-prob pass (`PackedLogprobs`, whatever `opts.packed` says) over the probes of this
  process's rows."""

  def __init__(self, graphdef: nnx.GraphDef, place: Placement, opts: StepOptions):
    self.logprobs = PackedLogprobs(graphdef, place, dataclasses.replace(opts, packed=True))

  @property
  def packer(self):
    return self.logprobs.packer

  def __call__(self, params: nnx.State, r: Rollouts, prefix: Sequence, gold: Sequence
               ) -> jnp.ndarray:
    probes = probe_sequences(r, prefix, gold, multiple=self.packer.shards)
    logp = np.asarray(self.logprobs(params, probes.tokens, probes.valid, probes.group,
                                    probes.needed))
    return jnp.asarray(scatter_means(logp, probes, (r.num_rows, r.max_steps)))
