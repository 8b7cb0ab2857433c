"""EMPG: entropy-modulated policy gradients, step credit from the policy's own uncertainty
(spec §4.4).

Wang et al. 2025, "Harnessing Uncertainty: Entropy-Modulated Policy Gradients for Long-Horizon
LLM Agents" (arXiv 2509.09265; no public code, a pseudocode on the project page
empgseed-seed.github.io). Each step's outcome advantage is rescaled by how certain the policy
was at that step and a bonus rewards steps whose *next* step is certain:

  H̃_t  = (H_t − min H) / (max H − min H + ε)            batch min-max (Eq. 12), ε = 1e-8
  g_t  = exp(−k · H̃_t) / (mean_batch exp(−k · H̃) + ε)   self-calibrating scale (Eq. 10)
  f_t  = exp(−k_f · H̃_t)                                 future clarity (Eq. 11)
  A_t  = g_t · A_row + ζ · f_{t+1}                        modulated advantage
  A'_t = A_t − mean_batch A                               (`center`)

The choices the paper leaves open, fixed here (docs/formulas.md "EMPG"):

* A *step* is a turn of tirjax's structure: the generated tokens of one `token_step` (the
  paper's steps are its agent's assistant turns, which is the same cut).
* H_t is the mean over the step's loss tokens of the sampled token's surprisal −log π_old,
  read from `Rollouts.old_logprobs`. The contract carries no per-token entropy over the
  vocabulary; the surprisal of the sampled token is an unbiased one-sample estimate of that
  entropy (E_{y~π}[−log π(y)] = H(π)), so its step mean estimates the paper's mean token
  entropy. A row sampled by vLLM carries vLLM's log-probs here, as the loss does.
* A_row is GRPO's outcome advantage (the z-score of R_out in the query's group, `zscore`);
  the paper modulates its baseline's advantage (GRPO or DAPO).
* The batch statistics (min, max, the mean of g, the centering mean) run over the *scored*
  steps: valid steps of valid rows with at least one loss token. A step without loss tokens
  has no entropy and no gradient: it gets g = 1 and gives no bonus to the step before it.
* The last step of a row has no next step: its bonus is 0.
* `center` subtracts the mean over scored steps, each step once (not each token once).
* EMPG is batch-global, not group-relative: all-equal rewards still leave ζ · f (centred).
"""

from __future__ import annotations

import dataclasses

import chex
import jax.numpy as jnp

from tirjax import option_checks, segments
from tirjax.advantages.group import broadcast_steps, group_zscore
from tirjax.advantages.registry import Advantages, register
from tirjax.rollouts import Rollouts

_EPS = 1e-8  # the project page's ε of the min-max and of the mean of g


@dataclasses.dataclass(frozen=True)
class EMPGOptions:
  """Defaults are the project page's pseudocode (k = k_f = 1, ζ = 0.1).

  Attributes:
    k: k of the self-calibrating scale g(H) = exp(−k H̃) / mean exp(−k H̃).
    k_f: k_f of the future clarity bonus f(H) = exp(−k_f H̃).
    zeta: ζ, the weight of the bonus.
    center: subtract the batch mean of the modulated step advantages.
    zscore: conventions of the outcome advantage A_row (GRPO's z-score).
  """

  k: float = 1.0
  k_f: float = 1.0
  zeta: float = 0.1
  center: bool = True
  zscore: segments.ZScore = segments.ZScore()

  def __post_init__(self):
    option_checks.finite_at_least("k", self.k, 0)
    option_checks.finite_at_least("k_f", self.k_f, 0)
    option_checks.finite_at_least("zeta", self.zeta, 0)
    if not isinstance(self.center, bool):
      raise ValueError(f"center: must be a bool, got {self.center!r}")
    if not isinstance(self.zscore, segments.ZScore):
      raise ValueError(f"zscore: must be a segments.ZScore, got {type(self.zscore).__name__}")


def step_surprisal(r: Rollouts):
  """([B, T] mean −log π_old over each step's loss tokens, [B, T] its number of loss tokens);
  0 where a step has none."""
  B, T = r.num_rows, r.max_steps
  live = r.loss_mask & r.row_valid[:, None]
  ids = jnp.arange(B)[:, None] * T + jnp.clip(r.token_step, 0, T - 1)
  count = segments.segment_count(ids, live, B * T).reshape(B, T)
  total = segments.segment_sum(-r.old_logprobs, ids, live, B * T).reshape(B, T)
  return total / jnp.maximum(count, 1.0), count


def minmax_normalise(h, scored):
  """H̃ = (H − min H) / (max H − min H + ε) over the scored entries (Eq. 12); 0 elsewhere."""
  chex.assert_equal_shape([h, scored])
  lo = jnp.min(jnp.where(scored, h, jnp.inf))
  hi = jnp.max(jnp.where(scored, h, -jnp.inf))
  lo, hi = jnp.where(jnp.any(scored), lo, 0.0), jnp.where(jnp.any(scored), hi, 0.0)
  return jnp.where(scored, (h - lo) / (hi - lo + _EPS), 0.0)


def gradient_scale(h_norm, scored, k: float):
  """g = exp(−k H̃) / (mean over scored steps of exp(−k H̃) + ε) (Eq. 10); 1 off scored steps."""
  raw = jnp.exp(-k * h_norm)
  mean = jnp.sum(jnp.where(scored, raw, 0.0)) / jnp.maximum(jnp.sum(scored), 1)
  return jnp.where(scored, raw / (mean + _EPS), 1.0)


def next_step_bonus(h_norm, scored, k_f: float):
  """f(H̃_{t+1}) = exp(−k_f H̃_{t+1}) of the row's next step (Eq. 11); 0 when step t+1 is not
  scored (the row's last step, or a next step without loss tokens)."""
  f = jnp.where(scored, jnp.exp(-k_f * h_norm), 0.0)
  return jnp.concatenate([f[:, 1:], jnp.zeros_like(f[:, :1])], axis=1)


@register("empg", EMPGOptions, spec="4.4",
          reference="tirjax.testing.reference.empg:empg")
def empg(r: Rollouts, opts: EMPGOptions) -> Advantages:
  """EMPG: A_t = g(H_t) · A_row + ζ · f(H_{t+1}), centred over the batch's scored steps."""
  row_adv = group_zscore(r, r.outcome, opts.zscore)
  h, count = step_surprisal(r)
  scored = r.step_valid & r.row_valid[:, None] & (count > 0)
  h_norm = minmax_normalise(h, scored)
  g = gradient_scale(h_norm, scored, opts.k)
  bonus = next_step_bonus(h_norm, scored, opts.k_f)
  steps = g * row_adv[:, None] + opts.zeta * bonus
  if opts.center:
    mean = jnp.sum(jnp.where(scored, steps, 0.0)) / jnp.maximum(jnp.sum(scored), 1)
    steps = steps - mean
  return broadcast_steps(r, steps, row_adv, r.outcome, step_entropy=jnp.where(scored, h, 0.0),
                         gradient_scale=jnp.where(r.step_valid, g, 0.0),
                         clarity_bonus=jnp.where(r.step_valid, bonus, 0.0))
