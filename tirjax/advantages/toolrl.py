"""ToolRL: format + tool-call correctness reward, normalised per group (spec §4.3).

Qian et al. 2025, "ToolRL: Reward is All Tool Learning Needs", §3.3: R = R_format + R_correct
with R_format ∈ {0, 1} and R_correct = 6 · R_max / S_max − 3 ∈ [−3, 3], where
  R_max = r_name + max over one-to-one matchings of Σ_matched (r_param + r_value),
  r_name = |N_G ∩ N_P| / |N_G ∪ N_P| over the multisets of tool names,
  r_param = Jaccard index of the parameter-name sets (1 for two empty sets),
  r_value = number of ground-truth parameters whose value the prediction repeats,
  S_max = 1 + Σ_{g ∈ G} (1 + |keys(g)|).
Pairs only match when their tool names agree. ToolRL scores one turn; here, as in the copy in
the public MatchTIR code (`compute_toolrl`), the predicted set is every call of the row (all
turns) and G the query's ground-truth calls. Choices of this implementation:
* R_max uses an exact maximum-weight matching (the paper's max); ToolRL's code matches each
  ground-truth call in turn to its best free prediction, which can fall short of it.
* a query without ground-truth calls gets R_correct = 0 (ToolRL's code skips the term).
* R_format = 1 when the row has steps and every step passed the first `format_checks` of
  PORTool's five format checks (spec §4.1), read back from `format_reward`; the default 3
  means: a think block, a tool-call block, and a parseable call list.
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp

from tirjax import option_checks, segments
from tirjax.advantages.group import broadcast_rows
from tirjax.advantages.registry import Advantages, register
from tirjax.matching.hungarian import matched_weights, max_weight_matching
from tirjax.matching.similarity import pair_stats
from tirjax.rollouts import Rollouts


@dataclasses.dataclass(frozen=True)
class ToolRLOptions:
  format_checks: int = 3  # how many of PORTool's format checks every step must pass
  zscore: segments.ZScore = segments.ZScore()

  def __post_init__(self):
    option_checks.one_of("format_checks", self.format_checks, (1, 2, 3, 4, 5))


def checks_passed(format_reward: jax.Array) -> jax.Array:
  """Number of PORTool format checks passed, from R_fm = 0.25 · (2 · passed / 5 − 1)."""
  return jnp.round((format_reward / 0.25 + 1.0) * 2.5).astype(jnp.int32)


def format_score(r: Rollouts, format_checks: int) -> jax.Array:
  """R_format ∈ {0, 1} per row."""
  ok = jnp.all(~r.step_valid | (checks_passed(r.format_reward) >= format_checks), axis=1)
  return (ok & (r.num_steps > 0) & r.row_valid).astype(jnp.float32)


def name_jaccard(r: Rollouts, same_name: jax.Array) -> jax.Array:
  """r_name: multiset Jaccard of predicted and ground-truth tool names (1 if both empty)."""
  chex.assert_equal_shape([same_name, r.call_sim])  # [B, T, K, C]
  chex.assert_type(same_name, bool)
  calls = r.calls
  gt_same = (calls.gt_name[:, :, None] == calls.gt_name[:, None, :]) & r.gt_valid[:, None, :]
  n_gt_name = jnp.sum(gt_same, axis=2)  # [B, C] multiplicity of c*'s name among the gt calls
  n_pred_name = jnp.sum(same_name & r.call_valid[..., None], axis=(1, 2))  # [B, C]
  # Σ over distinct names of min(multiplicities), spread evenly over that name's gt calls.
  inter = jnp.sum(jnp.where(r.gt_valid, jnp.minimum(n_gt_name, n_pred_name)
                            / jnp.maximum(n_gt_name, 1), 0.0), axis=1)
  union = jnp.sum(r.gt_valid, axis=1) + jnp.sum(r.call_valid, axis=(1, 2)) - inter
  return jnp.where(union > 0, inter / jnp.maximum(union, 1.0), 1.0)


def correctness(r: Rollouts) -> dict:
  """R_correct = 6 · R_max / S_max − 3 per row, with its parts."""
  B, T, K, C = r.call_sim.shape
  s = pair_stats(r.calls)
  # `call_sim > 0` holds for every valid same-name pair, except where the rollout masked the pair
  # out (a dialogue's call against another user turn's ground truth, spec §6.1).
  same_name = s["name"] & r.call_valid[..., None] & r.gt_valid[:, None, None, :] & (r.call_sim > 0)
  jaccard = jnp.where(s["union"] > 0, s["inter"] / jnp.maximum(s["union"], 1.0), 1.0)
  pair = jnp.where(same_name, jaccard + s["values"], 0.0).reshape(B, T * K, C)
  _, per_gt = matched_weights(pair, max_weight_matching(pair))
  r_name = name_jaccard(r, s["name"])
  r_max = r_name + jnp.sum(per_gt, axis=1)
  n_keys = jnp.sum(r.calls.gt_keys >= 0, axis=2)
  s_max = 1.0 + jnp.sum(jnp.where(r.gt_valid, 1.0 + n_keys, 0.0), axis=1)
  has_gt = jnp.any(r.gt_valid, axis=1)
  correct = jnp.where(has_gt, 6.0 * r_max / s_max - 3.0, 0.0)
  return dict(correct=correct, name_score=r_name, r_max=r_max, s_max=s_max)


@register("toolrl", ToolRLOptions, spec="4.3", protocol="hidifftir",
          reference="tirjax.testing.reference.matching:toolrl")
def toolrl(r: Rollouts, opts: ToolRLOptions) -> Advantages:
  """ToolRL: group z-score of R_format + R_correct, broadcast to the row's tokens."""
  if r.calls is None:
    raise ValueError("toolrl: Rollouts.calls (the call encodings) is required")
  parts = correctness(r)
  fmt = format_score(r, opts.format_checks)
  reward = jnp.where(r.row_valid, fmt + parts["correct"], 0.0)
  adv = segments.zscore(reward, r.group_id, r.row_valid, r.num_rows, opts.zscore)
  return broadcast_rows(r, adv, reward, format=fmt, **parts)
