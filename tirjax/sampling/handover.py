"""Checking that a sampler runs the trainer's weights: sampler vs teacher-forced log-probs.

After new weights are handed to a sampler, both sides score the same tokens: the sampler's
log-probs of the tokens it sampled, and the trainer's teacher-forced log-probs of the same
sequences. Their gap is the sampler-vs-trainer mismatch of spec §7 (logged every step by the
trainer); after a hand-over it must lie within a tolerance, or the hand-over failed.

A *teacher* is any callable `teacher_logprobs(sequences) -> per-token log-probs`: given a list
of token-id sequences, it returns one sequence of floats per input, of the same length, whose
entry t is `log p(seq[t] | seq[:t])` (entry 0 has no context and is never read). The trainer
plugs in tirjax's model; tests use transformers' PyTorch model.
"""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Callable, Sequence

from tirjax.sampling.interface import Sample

TeacherLogprobs = Callable[[list[list[int]]], Sequence[Sequence[float]]]


@dataclasses.dataclass(frozen=True)
class LogprobGap:
  """|sampler log-prob − teacher log-prob| over every sampled token.

  Attributes:
    max_abs: the largest gap (inf if either side gave a non-finite value).
    mean_abs: the mean gap.
    num_tokens: how many sampled tokens were compared.
    worst: (sequence index, position in the sequence) of the largest gap.
  """
  max_abs: float
  mean_abs: float
  num_tokens: int
  worst: tuple[int, int]


class WeightMismatchError(RuntimeError):
  """A sampler's log-probs differ from the teacher's by more than the tolerance."""

  def __init__(self, message: str, gap: LogprobGap):
    super().__init__(message)
    self.gap = gap


def probe_prompts(num: int = 4, length: int = 12, vocab: int = 200,
                  seed: int = 0) -> tuple[tuple[int, ...], ...]:
  """A fixed batch of `num` random prompts of `length` ids in [2, vocab)."""
  if num < 1 or length < 1 or vocab < 3:
    raise ValueError(f"probe_prompts: need num >= 1, length >= 1, vocab >= 3; "
                     f"got {num}, {length}, {vocab}")
  rng = random.Random(seed)
  return tuple(tuple(rng.randrange(2, vocab) for _ in range(length)) for _ in range(num))


def measure_gap(prompts: Sequence[Sequence[int]], samples: Sequence[Sequence[Sample]],
                teacher_logprobs: TeacherLogprobs) -> LogprobGap:
  """Scores every `prompt + sample.tokens` with the teacher and compares on sampled tokens.

  Args:
    prompts: the prompts the samples continue.
    samples: per prompt, its samples (as `Sampler.generate` returns them).
    teacher_logprobs: see the module docstring.

  Returns:
    The gap over all sampled tokens.
  """
  if len(prompts) != len(samples):
    raise ValueError(f"samples: one list per prompt expected, got {len(samples)} lists for "
                     f"{len(prompts)} prompts")
  seqs, starts, sampled = [], [], []
  for prompt, group in zip(prompts, samples):
    for s in group:
      if len(s.tokens) != len(s.logprobs):
        raise ValueError(f"samples: {len(s.tokens)} tokens but {len(s.logprobs)} log-probs")
      seqs.append(list(prompt) + list(s.tokens))
      starts.append(len(prompt))
      sampled.append(s.logprobs)
  if not seqs:
    raise ValueError("samples: nothing to compare")
  teacher = teacher_logprobs(seqs)
  if len(teacher) != len(seqs):
    raise ValueError(f"teacher_logprobs: returned {len(teacher)} sequences for {len(seqs)}")
  worst, max_abs, total, count = (0, 0), -1.0, 0.0, 0
  for i, (seq, start, lps) in enumerate(zip(seqs, starts, sampled)):
    if len(teacher[i]) != len(seq):
      raise ValueError(f"teacher_logprobs: sequence {i} has {len(seq)} tokens but "
                       f"{len(teacher[i])} log-probs")
    for j, lp in enumerate(lps):
      diff = abs(float(teacher[i][start + j]) - float(lp))
      diff = diff if math.isfinite(diff) else math.inf
      total += diff
      count += 1
      if diff > max_abs:
        worst, max_abs = (i, start + j), diff
  if count == 0:
    raise ValueError("samples: they hold no tokens")
  return LogprobGap(max_abs=max_abs, mean_abs=total / count, num_tokens=count, worst=worst)


def check_gap(gap: LogprobGap, tolerance: float, what: str) -> None:
  """Raises `WeightMismatchError` naming `what` and the measured gap if it exceeds tolerance."""
  if not gap.max_abs <= tolerance:
    raise WeightMismatchError(
        f"{what}: sampler and teacher log-probs differ by up to {gap.max_abs:.4g} "
        f"(mean {gap.mean_abs:.4g} over {gap.num_tokens} sampled tokens; worst at sequence "
        f"{gap.worst[0]}, position {gap.worst[1]}), more than the tolerance {tolerance:g}", gap)
