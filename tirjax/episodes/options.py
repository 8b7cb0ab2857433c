"""Options of the rollout stage: padded shapes, episodes, and the three rollout modes.

Every option is a frozen dataclass whose defaults are the spec's (PORTool: n = 8, f = 2,
T_max = 6) or, for ARPO, those of the public ARPO training scripts (dongguanting/ARPO:
16 rollouts, 8 initial, beam 2, branch probability 0.5, entropy weight 0.2, top-10 log-probs
of the first 20 tokens). `tirjax.config.config_from_dataclass(RolloutOptions)` gives the
config section.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, get_args

from tirjax import option_checks
from tirjax.env.executor import SolveScoring
from tirjax.env.tools import AnswerProtocol

Mode = Literal["independent", "tree", "arpo"]
MODES = get_args(Mode)


@dataclasses.dataclass(frozen=True)
class Shapes:
  """The fixed `Rollouts` shapes (spec §2), so that the trainer compiles once.

  Attributes:
    num_rows: B, rows of a batch (queries × rows per query must fit).
    max_steps: T, at least the step limit T_max (`RolloutOptions.max_steps`).
    max_calls: K, kept calls per step; also the parser's limit on the calls of one step, so a
      longer step is an explicit error to the agent.
    max_gt_calls: C, ground-truth calls of a task (a task with more is rejected up front).
    max_tokens: L, tokens per row (prompt, steps and tool responses).
    max_params: P, arguments per call; also the parser's limit (`ParseLimits.max_arguments`).
  """

  num_rows: int = 64
  max_steps: int = 6
  max_calls: int = 4
  max_gt_calls: int = 8
  max_tokens: int = 4096
  max_params: int = 8

  def __post_init__(self):
    for name in ("num_rows", "max_steps", "max_calls", "max_gt_calls", "max_tokens",
                 "max_params"):
      option_checks.at_least(name, getattr(self, name), 1)


@dataclasses.dataclass(frozen=True)
class TreeOptions:
  """PORTool's rollout tree (Algorithm 1, spec §4.1). `branch_factor` is f."""

  branch_factor: int = 2  # f: the branches forked at each expanded node

  def __post_init__(self):
    option_checks.at_least("branch_factor", self.branch_factor, 1)


@dataclasses.dataclass(frozen=True)
class ArpoOptions:
  """ARPO's entropy-based adaptive rollout (Dong et al. 2025, §3.2; dongguanting/ARPO).

  Attributes:
    initial_rollouts: rollouts started per query (M).
    total_rollouts: the per-query budget N: rows per query at the end.
    beam_size: a row that branches gets up to `beam_size - 1` copies per round.
    branch_probability: τ; with no entropy change a row branches with this probability.
    entropy_weight: w in `branch iff u − w·ΔH ≤ τ`, u ~ U(0, 1).
    entropy_tokens: k, the first generated tokens of a step whose entropy is measured.
    top_logprobs: log-probs per position requested from samplers that give no entropies.
  """

  initial_rollouts: int = 8
  total_rollouts: int = 16
  beam_size: int = 2
  branch_probability: float = 0.5
  entropy_weight: float = 0.2
  entropy_tokens: int = 20
  top_logprobs: int = 10

  def __post_init__(self):
    for name in ("initial_rollouts", "total_rollouts", "beam_size", "entropy_tokens",
                 "top_logprobs"):
      option_checks.at_least(name, getattr(self, name), 1)
    if self.initial_rollouts > self.total_rollouts:
      raise ValueError(f"initial_rollouts: must be <= total_rollouts={self.total_rollouts}, "
                       f"got {self.initial_rollouts}")
    option_checks.lies_in("branch_probability", self.branch_probability, 0, 1)
    option_checks.at_least("entropy_weight", self.entropy_weight, 0)


@dataclasses.dataclass(frozen=True)
class RolloutOptions:
  """How a batch of queries becomes a `Rollouts` batch.

  Attributes:
    mode: "independent" (n rows per query), "tree" (PORTool) or "arpo".
    n: rows per query in the independent and tree modes (ARPO: `arpo.total_rollouts`).
    max_steps: T_max, steps per row; an unfinished row at T_max gets R_out = −1.
    max_new_tokens: per step. A row ends truncated (R_out = −1) when its next step could
      not fit: when its length plus `max_new_tokens` would exceed `shapes.max_tokens`.
    temperature, top_p: sampling.
    seed: seeds the `numpy.random.Generator` of selections and sampler seeds.
    logprob_temperature: the temperature of the distribution whose log-probs the sampler
      reports (`SamplingParams.logprob_temperature`): derived, not set (the trainer sets it
      to `temperature` where a rollout correction compares the tempered policy's log-probs
      with the sampler's; 1, the raw model's, otherwise).
    answer_protocol: "response_gen" or "answer_tag" (spec §6).
    judge_workers: answered rows judged in parallel (an LLM judge waits on the network).
    solve_scoring: "ftrl" (FTRL's scorer: schema-violating calls of a Solve-scored task are
      still run) or "strict" (refused); see `tirjax.env.executor.ToolEnvOptions`.
    greedy_baseline: also run one greedy episode per query (independent, n = 1, temperature
      0), judged like the others, and record its R_out as every row's `greedy_outcome`
      (ReMax's baseline, `remax`); the greedy rows are not rows of the batch.
    strict_directions: score `call_sim` strictly (`matching.similarity.strict_call_similarity`,
      issue 51): a call whose direction parameters (its task's `direction_params`: toolworld's
      compare mode, convert units, ...) differ from the ground truth's is unmatched (0), not a
      near-match; needs tasks that name them. Off (default): HiDiffTIR's Eq. 22-25 as is.
  """

  mode: Mode = "independent"
  n: int = 8
  max_steps: int = 6
  max_new_tokens: int = 512
  temperature: float = 1.0
  top_p: float = 1.0
  seed: int = 0
  logprob_temperature: float = 1.0
  answer_protocol: AnswerProtocol = "response_gen"
  judge_workers: int = 1
  solve_scoring: SolveScoring = "ftrl"
  greedy_baseline: bool = False
  strict_directions: bool = False
  tree: TreeOptions = TreeOptions()
  arpo: ArpoOptions = ArpoOptions()
  shapes: Shapes = Shapes()

  def __post_init__(self):
    option_checks.typed_choices(self)
    for name in ("n", "max_steps", "max_new_tokens", "judge_workers"):
      option_checks.at_least(name, getattr(self, name), 1)
    option_checks.flag("greedy_baseline", self.greedy_baseline)
    option_checks.flag("strict_directions", self.strict_directions)
    option_checks.at_least("temperature", self.temperature, 0)
    option_checks.lies_in("top_p", self.top_p, 0, 1, open_low=True)
    if self.max_steps > self.shapes.max_steps:
      raise ValueError(f"max_steps: T_max={self.max_steps} exceeds shapes.max_steps="
                       f"{self.shapes.max_steps}")
    if self.max_new_tokens >= self.shapes.max_tokens:
      raise ValueError(f"max_new_tokens: {self.max_new_tokens} leaves no room for a prompt in "
                       f"shapes.max_tokens={self.shapes.max_tokens}")

  @property
  def rows_per_query(self) -> int:
    return self.arpo.total_rollouts if self.mode == "arpo" else self.n
