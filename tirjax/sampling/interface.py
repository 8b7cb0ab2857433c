"""The sampler interface (spec §7): token ids in, token ids and log-probs out.

Nothing is decoded and re-encoded between turns: the episode runner appends the exact ids a
sampler returns, and tool responses are tokenised and appended after them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Protocol, Sequence

from tirjax import option_checks


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  n: int = 1
  temperature: float = 1.0
  top_p: float = 1.0
  max_new_tokens: int = 256
  stop_token_ids: tuple[int, ...] = ()
  seed: int = 0
  top_logprobs: int = 0  # >0: also return the top-k log-probs per position (ARPO's entropy)
  # Per prompt, a distinct id >= 0 that its samples' randomness is keyed on (with the seed),
  # so that a prompt draws the same samples whatever else is in the call; () = its position.
  row_ids: tuple[int, ...] = ()
  # The temperature of the distribution whose log-probs `Sample.logprobs` reports: 1 (the
  # raw model's, the default), or the sampling temperature, where the trainer's policy is the
  # tempered one and compares its log-probs with the sampler's (`train.tempered_policy` with a
  # rollout correction). The built-in JAX sampler reports either; vLLM's report the raw model's.
  logprob_temperature: float = 1.0

  def __post_init__(self):
    option_checks.at_least("n", self.n, 1)
    option_checks.lies_in("logprob_temperature", self.logprob_temperature, 0, float("inf"),
                          open_low=True)
    option_checks.at_least("temperature", self.temperature, 0)
    option_checks.lies_in("top_p", self.top_p, 0, 1, open_low=True)
    option_checks.at_least("max_new_tokens", self.max_new_tokens, 1)
    if self.row_ids:
      ids = self.row_ids
      if len(set(ids)) != len(ids) or min(ids) < 0 or (max(ids) + 1) * self.n > 2**31 - 1:
        raise ValueError(f"row_ids: must be distinct ids >= 0 with (id + 1) * n < 2**31, got "
                         f"{ids[:8]}{'...' if len(ids) > 8 else ''} with n={self.n}")


@dataclasses.dataclass
class Sample:
  tokens: list[int]  # sampled ids, the stop token included when one was hit
  # log-prob of each id under softmax(z / logprob_temperature) (`SamplingParams`; 1: the raw
  # model's), top-p not applied
  logprobs: list[float]
  finish_reason: str  # "stop" (a stop token) or "length" (max_new_tokens)
  policy_version: int = 0
  entropies: Optional[list[float]] = None  # per position, when the sampler can give them
  top_logprobs: Optional[list[dict[int, float]]] = None


class Sampler(Protocol):
  policy_version: int

  def generate(self, prompts: Sequence[Sequence[int]],
               params: SamplingParams) -> list[list[Sample]]:
    """For each prompt, `params.n` samples."""
    ...


class PolicySampler(Sampler, Protocol):
  """A sampler the trainer drives: it takes each new policy and is released at the end."""

  def update(self, params: Any, policy_version: int) -> None:
    """New weights (the policy's parameters, same structure) and their version."""
    ...

  def sleep(self) -> None:
    """Sampling is over until the next `update` or `generate`: free what can be freed (the
    trainer's update runs next on the same accelerators)."""
    ...

  def close(self) -> None:
    """Releases what the sampler holds (servers, caches); idempotent."""
    ...
