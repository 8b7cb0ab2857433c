"""An abstract multi-step tool-choice task with necessary steps and a known optimal policy.

The agent must call D tools in order (the *necessary* steps), then answer. At progress k
(necessary tools called so far) each of the A actions is one of four kinds:

* `advance`: the tool the chain needs next (tool k + 1; only for k < D): progress k + 1.
* `answer`: action 0, the terminal tool. Correct (R_out = +1) at progress D; before that the
  agent answers without the information it needs and the judge says `unable_to_answer`
  (R_out = `early_answer`, 0 by default).
* `fatal`: a call that crashes the episode: it ends with R_out = −1 and R_fm = `fatal_format`.
* `detour`: any other tool (a distractor, or a chain tool out of order): it runs, wastes a step.

Every non-fatal step has R_fm = `ok_format`. An episode that has not answered after `max_steps`
steps ends with R_out = −1. The optimal policy calls tools 1..D and answers: success with
probability 1 in D + 1 steps.

Why GRPO unlearns here (PORTool's Theorem 3.1): a stage with many fatal actions follows the
first necessary step (default `fatal=(1, 4, 1, 1)`), and an early answer scores 0, above the
−1 of a crash. Rows through a necessary step mostly die at the hard stage, while rows that
answered early keep 0, so a step that every correct leaf of its fork passes through can carry
a below-average mean outcome: a negative GRPO advantage, the theorem's Pr(correct | s* absent)
= 0 case. PORTool's fork term ranks the step against its siblings by the best outcome below it
(a correct leaf), which keeps it positive. Early answering is also a genuine local optimum of
the return while the hard stage is unlearned (0 beats mostly −1): every estimator first drifts
towards it, and how fast it leaves is what "episodes to 90 %" measures.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tirjax import option_checks

ANSWER = 0
# Action kinds of `ChainTask.kinds()`.
ADVANCE, DETOUR, FATAL, ANSWER_KIND = 0, 1, 2, 3


@dataclasses.dataclass(frozen=True)
class ChainTask:
  """A chain of `num_stages` necessary tool calls among `num_actions` actions.

  Attributes:
    num_stages: D, the number of necessary tool calls before the answer.
    num_actions: A, the answer action plus A − 1 tools (tools 1..D are the chain).
    fatal: fatal actions per progress k = 0..D (length D + 1), taken among the A − 1 − D
      distractor tools, rotated by k so that different stages crash on different tools.
    max_steps: T_max; an episode that has not answered by then ends with R_out = −1.
    early_answer: R_out of an answer before progress D: 0 (`unable_to_answer`) or −1.
    ok_format: R_fm of a step that runs (advance, detour, answer).
    fatal_format: R_fm of a fatal step.
  """

  num_stages: int = 3
  num_actions: int = 8
  fatal: tuple[int, ...] = (1, 4, 1, 1)
  max_steps: int = 6
  early_answer: float = 0.0
  ok_format: float = 0.25
  fatal_format: float = -0.25

  def __post_init__(self):
    option_checks.at_least("num_stages", self.num_stages, 1)
    option_checks.at_least("num_actions", self.num_actions, self.num_stages + 2,
                           why="num_stages + 2: the answer, the chain tools and a distractor")
    if len(self.fatal) != self.num_stages + 1:
      raise ValueError(f"fatal: needs one count per progress 0..{self.num_stages} "
                       f"({self.num_stages + 1} values), got {self.fatal}")
    if any(not 0 <= f <= self.num_distractors for f in self.fatal):
      raise ValueError(f"fatal: each count must lie in [0, {self.num_distractors}] (the "
                       f"distractor tools), got {self.fatal}")
    option_checks.at_least("max_steps", self.max_steps, self.num_stages + 1,
                           why="num_stages + 1, so that the task can be solved")
    if self.early_answer not in (0.0, -1.0):
      raise ValueError(f"early_answer: must be 0 (unable_to_answer) or -1, "
                       f"got {self.early_answer}")
    for name in ("ok_format", "fatal_format"):
      option_checks.lies_in(name, getattr(self, name), -0.25, 0.25)

  @property
  def num_distractors(self) -> int:
    return self.num_actions - 1 - self.num_stages

  @property
  def num_progress(self) -> int:
    """Progress values 0..D."""
    return self.num_stages + 1

  @property
  def num_states(self) -> int:
    """Policy states (progress k, step t), indexed k · T_max + t."""
    return self.num_progress * self.max_steps

  def kinds(self) -> np.ndarray:
    """[D + 1, A] int: the kind (ADVANCE, DETOUR, FATAL, ANSWER_KIND) of each action."""
    D, A, M = self.num_stages, self.num_actions, self.num_distractors
    out = np.full((D + 1, A), DETOUR, np.int64)
    out[:, ANSWER] = ANSWER_KIND
    for k in range(D + 1):
      if k < D:
        out[k, k + 1] = ADVANCE
      for i in range(self.fatal[k]):
        out[k, 1 + D + (k + i) % M] = FATAL
    return out

  def optimal_action(self) -> np.ndarray:
    """[D + 1] the optimal action at each progress: the next chain tool, then the answer."""
    return np.array([k + 1 for k in range(self.num_stages)] + [ANSWER])


def state_index(task: ChainTask, progress, step):
  """The policy state (progress k, step t) as one index k · T_max + t."""
  return np.asarray(progress) * task.max_steps + np.asarray(step)


def transition(task: ChainTask, progress: np.ndarray, action: np.ndarray) -> dict:
  """The environment's response to `action` at `progress` (arrays of one shape).

  Returns:
    dict of arrays: `progress` after the step, `done` (the episode ended), `answered` (it
    ended by answering), `outcome` (R_out where done, else 0), `format_reward` (R_fm),
    `kind` (the action's kind) and `solves` (the step advanced the chain: FTRL's verified call).
  """
  kind = task.kinds()[progress, action]
  answered = kind == ANSWER_KIND
  fatal = kind == FATAL
  correct = answered & (progress == task.num_stages)
  outcome = np.where(correct, 1.0, np.where(answered, task.early_answer,
                                            np.where(fatal, -1.0, 0.0)))
  return dict(progress=progress + (kind == ADVANCE), done=answered | fatal, answered=answered,
              outcome=outcome, kind=kind, solves=kind == ADVANCE,
              format_reward=np.where(fatal, task.fatal_format, task.ok_format))
