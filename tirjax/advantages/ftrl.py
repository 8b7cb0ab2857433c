"""FTRL: the solve-F1 reward of verifiable tool feedback, normalised per group (spec §4.3).

Ye et al. 2025, "Feedback-driven tool-use improvements in large language models via automated
build environments" (FTRL; bytedance/FTRL, `Code/verl/utils/reward_score/tool.py`,
`compute_solve_f1`, train split). A response with tool calls scores 2 s / (n_calls + 1),
s = calls whose output verifies a still-unsolved expected answer (each answer counts once,
`Rollouts.call_solves`); a response without calls scores by the answer rules:
  −0.3  a malformed tool call (a tool-call block whose content does not parse),
  −0.5  no answer (FTRL: empty content),
  1 / (1 + num_expected)  a correct answer (outcome = +1; nothing was solved by calls),
  0.5   nothing was left to solve (num_expected = 0; FTRL: solve rate 1),
  0     otherwise.
FTRL's own data cuts trajectories into turns, each scored with the expected answers still
unsolved before it. Here, as in the copy of this function in the public MatchTIR code that
the HiDiffTIR paper's baseline runs, the whole trajectory is the response: calls and solves
are summed over all turns, and a row with any call never reaches the answer rules. A
malformed call is read from `format_reward`: a step that passed exactly checks 1-2 of
PORTool's five (think block, tool-call block) and failed the parse check 3.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from tirjax import segments
from tirjax.advantages.group import broadcast_rows
from tirjax.advantages.registry import Advantages, register
from tirjax.advantages.toolrl import checks_passed
from tirjax.rollouts import Rollouts


@dataclasses.dataclass(frozen=True)
class FTRLOptions:
  zscore: segments.ZScore = segments.ZScore()


def ftrl_reward(r: Rollouts) -> jax.Array:
  """The FTRL solve-F1 training reward of each row (see the module docstring)."""
  n_calls = jnp.sum(r.call_valid, axis=(1, 2)).astype(jnp.float32)
  solved = jnp.sum(r.call_solves & r.call_valid, axis=(1, 2)).astype(jnp.float32)
  malformed = jnp.any(r.step_valid & (checks_passed(r.format_reward) == 2), axis=1)
  expected = r.num_expected.astype(jnp.float32)
  answer_rules = jnp.where(
      malformed, -0.3,
      jnp.where(~r.answered, -0.5,
                jnp.where(r.outcome == 1, 1.0 / (1.0 + expected),
                          jnp.where(r.num_expected == 0, 0.5, 0.0))))
  reward = jnp.where(n_calls > 0, 2.0 * solved / (n_calls + 1.0), answer_rules)
  return jnp.where(r.row_valid, reward, 0.0)


@register("ftrl", FTRLOptions, spec="4.3", protocol="hidifftir",
          reference="tirjax.testing.reference.matching:ftrl")
def ftrl(r: Rollouts, opts: FTRLOptions) -> Advantages:
  """FTRL: group z-score of the solve-F1 reward, broadcast to the row's tokens."""
  if r.call_solves is None or r.num_expected is None:
    raise ValueError("ftrl: Rollouts.call_solves and Rollouts.num_expected are required")
  reward = ftrl_reward(r)
  adv = segments.zscore(reward, r.group_id, r.row_valid, r.num_rows, opts.zscore)
  return broadcast_rows(r, adv, reward)
