"""MT-GRPO: the outcome advantage plus λ times a turn-reward advantage (spec §4.4).

Zeng et al. 2025, "Reinforcing Multi-Turn Reasoning in LLM Agents via Turn-Level Credit
Assignment" (arXiv 2505.11821; code: SiliangZeng/Multi-Turn-RL-Agent, `MTGRPOEnvTrainer`).
Each turn's tokens get

    A_{j,t} = Â^O_j + λ · Â^T_{j,t},    Â^O_j = z_g(R_out),

with Â^T built from verifiable intermediate rewards r_{j,t} of the turns. The paper and its
code have two turns (a tool call, then the answer) and one turn reward, given to the first
turn only; `credit` says how the turn term generalises to T turns, the choice where the bias
of verl's RFC #7244 lives:

* "immediate": Â^T_{j,t} = z(r_{j,t}) among the group's rows at turn index t; turn t is
  credited with its own reward only. The code's two-turn form (an answer turn without a turn
  reward gets z of equal zeros: nothing). Its baseline at turn t is a statistic of the rows
  that reached t, which the action at t does not change, so it adds no bias; but a turn is
  never credited with what it leads to.
* "return_per_index": Â^T_{j,t} = Σ_{t' ≥ t} z(r_{j,t'}), each reward normalised at its turn
  index, then summed into the earlier turns: the natural T-turn port, which verl's RFC #7244
  shows biased when the policy decides when to stop. The baseline it subtracts from a turn,
  Σ_{t' ≥ t} mean_{t'}, has as many terms as the row has turns left, so it depends on the
  row's own later actions: every decision to take another turn loses the expected
  intermediate reward it leads to (a hidden −E[R_intermediate] per extra turn).
* "return_loo" (the default, without that bias): Â^T_{j,t} = G_{j,t} − mean_{k ≠ j} G_{k,t},
  G_{j,t} = Σ_{t' ≥ t} r_{j,t'} the raw return-to-go of turn rewards, the mean over the
  group's other rows at turn index t (leave-one-out, as RLOO). The baseline of turn t is a
  statistic of other rows that reached t, whatever row j does from t on, so the stop/continue
  decision keeps the full value of the rewards it leads to. No std scaling: dividing by a
  spread that includes row j's own return would put its future back into the baseline.

Worked example of the bias: at turn 0 (reward 0) a row stops or continues; continuing earns
r = 1 at turn 1, then stops; R_out is equal for all. "return_per_index": every row reaching
turn 1 has r = 1, so z = 0 there, and turn 0 is 0 for all rows: no push towards the reward.
"return_loo" with two rows, one of each: G_0 = 1 and 0, so A^T_0 = +1 for the row that
continued and −1 for the one that stopped.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from tirjax import option_checks, segments
from tirjax.advantages import turns
from tirjax.advantages.group import broadcast_steps
from tirjax.advantages.registry import Advantages, register
from tirjax.rollouts import Rollouts

CREDITS = ("return_loo", "immediate", "return_per_index")
TURN_REWARDS = ("match", "format")


@dataclasses.dataclass(frozen=True)
class MTGRPOOptions:
  """Attributes:
    credit: how the turn rewards become Â^T (module docstring): "return_loo" (unbiased),
      "immediate" (the paper's two-turn form), "return_per_index" (the biased T-turn port).
    turn_reward: the verifiable intermediate reward r_{j,t}. "match" (the default): the mean
      similarity of the turn's calls matched one-to-one to the query's ground-truth calls
      (HiDiffTIR's raw turn reward, §4.2; 0 for a turn without calls, such as the answer), the
      analogue of the paper's tool-execution reward; "format": the turn's PORTool format
      reward R_fm.
    coef: λ, the weight of the turn term (the code's `turn_advantage_coef`, default 1).
    zscore: conventions of Â^O's group z-score and of "immediate" / "return_per_index"'s
      turn-index z-scores (spec §3; the code: eps 1e-4, ddof 1, groups of fixed size).
    matching: the matcher of `turn_reward="match"`: "greedy" (the default; MatchTIR's: the
      largest remaining positive pair first) or "hungarian" (the exact maximum weight, as
      HiDiffTIR's). Either is one-to-one, so repeating a right call earns nothing; the turn
      reward needs no optimal assignment, and the greedy one costs a fraction of the exact
      one (the kernel with it: benchmarks/results/bench_kernels_mt_grpo_hgpo_fast_cpu.md; with
      the exact one, whose cost it shares with hidifftir:
      benchmarks/results/bench_kernels_issue54_cpu.md).
  """

  credit: str = "return_loo"
  turn_reward: str = "match"
  coef: float = 1.0
  zscore: segments.ZScore = segments.ZScore()
  matching: str = "greedy"

  def __post_init__(self):
    option_checks.one_of("credit", self.credit, CREDITS)
    option_checks.one_of("turn_reward", self.turn_reward, TURN_REWARDS)
    option_checks.finite_at_least("coef", self.coef, 0.0)
    if not isinstance(self.zscore, segments.ZScore):
      raise ValueError(f"zscore: must be a segments.ZScore, got {type(self.zscore).__name__}")
    option_checks.one_of("matching", self.matching, turns.MATCHERS)


def turn_rewards(r: Rollouts, turn_reward: str, matching: str = "greedy") -> jax.Array:
  """[B, T] r_{j,t} on valid steps, 0 elsewhere."""
  if turn_reward == "format":
    raw = r.format_reward
  else:
    raw = turns.turn_mean(turns.match_calls(r, matching).call_reward, r.call_valid)
  return jnp.where(r.step_valid & r.row_valid[:, None], raw, 0.0)


def returns_to_go(x: jax.Array, mask: jax.Array) -> jax.Array:
  """[B, T] Σ_{t' ≥ t} x_{t'} over the row's valid steps (0 on padding)."""
  x = jnp.where(mask, x, 0.0)
  return jnp.where(mask, jnp.flip(jnp.cumsum(jnp.flip(x, axis=1), axis=1), axis=1), 0.0)


def turn_advantage(r: Rollouts, rewards: jax.Array, opts: MTGRPOOptions) -> jax.Array:
  """[B, T] Â^T by `opts.credit` (module docstring)."""
  ids, mask, n = turns.turn_segments(r)
  if opts.credit == "immediate":
    return segments.zscore(rewards, ids, mask, n, opts.zscore)
  if opts.credit == "return_per_index":
    return returns_to_go(segments.zscore(rewards, ids, mask, n, opts.zscore), mask)
  ret = returns_to_go(rewards, mask)
  count = segments.gather(segments.segment_count(ids, mask, n), ids)
  total = segments.gather(segments.segment_sum(ret, ids, mask, n), ids)
  others = (total - ret) / jnp.maximum(count - 1.0, 1.0)
  # spec §3: alone at the index, or every return there equal: exactly 0.
  return segments.degenerate_groups(ret - others, ret, ids, mask, n,
                                    segments.ZScore(scale="none"))


@register("mt_grpo", MTGRPOOptions, spec="4.4", group_normalised=True,
          reference="tirjax.testing.reference.mt_grpo:mt_grpo")
def mt_grpo(r: Rollouts, opts: MTGRPOOptions) -> Advantages:
  """MT-GRPO: A_{j,t} = z_g(R_out)_j + λ · Â^T_{j,t} on every generated token of turn t.

  Zeng et al. 2025 (arXiv 2505.11821), §3 (MT-GRPO: turn-level advantages from verifiable
  turn rewards added to GRPO's outcome advantage); code: SiliangZeng/Multi-Turn-RL-Agent
  (`MTGRPOEnvTrainer._assign_advantages`). Decisions: the T-turn turn term is `credit`'s
  (module docstring; default "return_loo", without RFC #7244's bias); the turn reward is the
  matched-call similarity (`turn_reward`); a row's turns get the turn term whether or not it
  went on to a tool response (the code gives a row that never got one z(R_turn + R_out)
  instead, a formula chosen by the row's own action); spec §3's conventions in every z-score.
  """
  rewards = turn_rewards(r, opts.turn_reward, opts.matching)
  outcome = segments.zscore(r.outcome, r.group_id, r.row_valid, r.num_rows, opts.zscore)
  turn = turn_advantage(r, rewards, opts)
  steps = outcome[:, None] + jnp.float32(opts.coef) * turn
  return broadcast_steps(r, steps, outcome, r.outcome, outcome_advantage=outcome,
                         turn_advantage=turn, turn_reward=rewards)
