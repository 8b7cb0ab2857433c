"""verl's optimal token baselines: `optimal_token_baseline` (OTB) and its multi-turn variant
`tir_optimal_token_baseline` (TIR-OTB) (spec §4.4).

Both give each generated token its own group baseline, the energy-weighted mean of the
returns of the query's rows at the same position,

    B_p = Σ_i G_p^(i) · W_p^(i) / Σ_i W_p^(i),    A = G − B_p,

W_p^(i) = Σ_{j ≤ p} w_j^(i) the energy that row i has accumulated over its generated tokens
up to position p, and w_j = ||e_{a_j} − π_j||² = 1 − 2π(a_j) + Σ_v π_j(v)², the squared norm of
the log-softmax gradient at token j (the "Logit-Gradient Proxy": the gradient's squared norm
without a backward pass). verl docs/algo/otb.md; Li, "Optimal Token Baseline" (blog,
richardli.xyz/optimal-token-baseline); verl's `compute_optimal_token_baseline_advantage` and
`compute_multi_turn_optimal_token_baseline_advantage` (`verl/trainer/ppo/core_algos.py`).

The two differ only in what "the same position" is. OTB counts positions from the row's first
generated token, tool-response tokens included: a single-turn response's token index. TIR-OTB
counts generated tokens only (its k-th policy token), so rows whose tool responses differ in
length still line up turn by turn.
Checked against verl's functions: `experiments/studies/verl_crosscheck.py`,
`tests/test_otb_gdpo_crosscheck.py`.
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp

from tirjax import option_checks, segments
from tirjax.advantages.group import broadcast_tokens
from tirjax.advantages.registry import Advantages, register
from tirjax.advantages.verl_baselines import generated_tokens
from tirjax.rollouts import Rollouts

ENERGIES = ("sampled", "sum_pi_squared")


@dataclasses.dataclass(frozen=True)
class OTBOptions:
  """Attributes:
    energy: the per-token energy w_j. "sum_pi_squared" (verl): 1 − 2π(a_j) + Σ_v π_j(v)², which
      reads `Rollouts.sum_pi_squared` (the credit bench's chain rollouts fill it; the trainer's
      samplers do not yet). "sampled" (the default here): 1 − π(a_j), the same with Σ_v π(v)²
      replaced by its one-sample estimate π(a_j) (E_{a∼π}[π(a)] = Σ_v π(v)²), so that
      E_a[w] is still the expected squared gradient norm 1 − Σ_v π(v)²; it needs only
      `old_logprobs`, so every batch has it.
    singleton: a group of one row: 0 (spec §3) or its raw return G (verl: baseline 0).
    zero_tail: verl's `handle_zero_tail`: where one row of the group is strictly the longest,
      its tokens past the second-longest row's length get baseline 0 (A = G). Off (spec §3:
      a position that one row alone reaches is a group of one there, so A = 0); verl's main
      turns it on for both estimators.
    eps: added to Σ W (verl: 1e-8). With 0 (the default) B_p is the exact weighted mean, and a
      position whose rows have no energy at all (Σ W = 0: every token so far certain) takes
      the plain mean of their returns, the limit of equal weights.
  """

  energy: str = "sampled"
  singleton: str = "zero"
  zero_tail: bool = False
  eps: float = 0.0

  def __post_init__(self):
    option_checks.one_of("energy", self.energy, ENERGIES)
    segments.ZScore(singleton=self.singleton)  # validates the value, naming `singleton`
    option_checks.flag("zero_tail", self.zero_tail)
    option_checks.finite_at_least("eps", self.eps, 0.0)


def token_energy(r: Rollouts, energy: str) -> jax.Array:
  """[B, L] w_j on generated tokens (0 elsewhere), clipped at 0.

  w = ||e_a − π||² ≥ 0 always; a sampler's π(a) and a trainer's Σπ² may disagree by rounding
  and make 1 − 2π + Σπ² slightly negative, which would let Σ W cancel, so it is clipped."""
  live = generated_tokens(r)
  pi = jnp.exp(jnp.where(live, r.old_logprobs, 0.0))
  if energy == "sum_pi_squared":
    if r.sum_pi_squared is None:
      raise ValueError("energy='sum_pi_squared' needs Rollouts.sum_pi_squared (Σ_v π(v)² of "
                       "each generated token); the trainer's samplers do not record it: use "
                       "energy='sampled'")
    chex.assert_equal_shape([r.sum_pi_squared, live])
    w = 1.0 - 2.0 * pi + r.sum_pi_squared
  else:
    w = 1.0 - pi
  return jnp.where(live, jnp.maximum(w, 0.0), 0.0)


def token_positions(r: Rollouts, align: str) -> jax.Array:
  """[B, L] int32 position p of each generated token (clipped to [0, L); read where live):
  "generated": its index among the row's generated tokens (TIR-OTB); "response": its offset
  from the row's first generated token, tool-response tokens counted (OTB)."""
  live = generated_tokens(r)
  L = r.max_tokens
  if align == "generated":
    pos = jnp.cumsum(live, axis=1) - 1
  else:
    first = jnp.argmax(live, axis=1)  # 0 for a row without generated tokens (never read)
    pos = jnp.arange(L)[None, :] - first[:, None]
  return jnp.clip(pos, 0, L - 1).astype(jnp.int32)


def row_lengths(r: Rollouts, align: str) -> jax.Array:
  """[B] the row's length in positions: its generated tokens ("generated"), or the span from
  its first to its last generated token ("response"); 0 for a row without any."""
  live = generated_tokens(r)
  if align == "generated":
    return jnp.sum(live, axis=1).astype(jnp.int32)
  pos = token_positions(r, align)
  return jnp.max(jnp.where(live, pos + 1, 0), axis=1).astype(jnp.int32)


def _tails(r: Rollouts, members: jax.Array, length: jax.Array, pos: jax.Array) -> jax.Array:
  """[B, L] bool: the positions of a group's strictly longest row at or past the
  second-longest member's length (verl's zero tail); groups of one row have none."""
  ids, B = r.group_id, r.num_rows
  longest = segments.gather(segments.segment_max(length, ids, members, B), ids)
  at_top = members & (length == longest)
  ties = segments.gather(segments.segment_count(ids, at_top, B), ids)
  second = segments.gather(segments.segment_max(length, ids, members & ~at_top, B), ids)
  unique = at_top & (ties == 1) & (segments.gather(segments.segment_count(ids, members, B),
                                                   ids) >= 2)
  return unique[:, None] & (pos >= second[:, None])


def optimal_baseline(r: Rollouts, opts: OTBOptions, align: str) -> Advantages:
  """The OTB advantage with positions aligned by `align` ("response" or "generated")."""
  ids, B, L = r.group_id, r.num_rows, r.max_tokens
  live = generated_tokens(r)
  ret = jnp.where(live, r.outcome[:, None], 0.0)  # G_p: the reward-to-go of R_out
  energy = jnp.cumsum(token_energy(r, opts.energy), axis=1)  # W_p
  pos = token_positions(r, align)
  # Rows of a group: every valid row (OTB, as verl counts them), or the rows that generated
  # a token (TIR-OTB, which leaves empty rows out of its groups).
  has_tokens = jnp.any(live, axis=1)
  members = r.row_valid & (has_tokens if align == "generated" else True)
  size = segments.gather(segments.segment_count(ids, members, B), ids)

  # One scatter of the sums and one of the extremes per (query, position) segment (the rows
  # there: Σ G·W, Σ W, count, Σ G; max G and max −G), masked tokens in a trash segment.
  seg = jnp.where(live, ids[:, None] * L + pos, B * L).ravel()
  sums = jax.ops.segment_sum(
      jnp.stack([ret * energy, energy, live.astype(jnp.float32), ret], -1).reshape(-1, 4),
      seg, B * L + 1)[seg]
  num, den, count, total_ret = (sums[:, k].reshape(B, L) for k in range(4))
  top = jax.ops.segment_max(jnp.stack([ret, -ret], -1).reshape(-1, 2), seg, B * L + 1)[seg]
  equal = (top[:, 0] == -top[:, 1]).reshape(B, L)
  total = den + opts.eps
  baseline = jnp.where(total > 0, num / jnp.where(total > 0, total, 1.0),
                       total_ret / jnp.maximum(count, 1.0))

  adv = jnp.where(equal, 0.0, ret - baseline)  # spec §3: equal returns give exactly 0
  if opts.zero_tail:
    tail = _tails(r, members, row_lengths(r, align), pos)
    adv = jnp.where(tail, ret, adv)
    baseline = jnp.where(tail, 0.0, baseline)
  single = (size == 1)[:, None]
  adv = jnp.where(single, ret if opts.singleton == "raw" else 0.0, adv)
  baseline = jnp.where(single, 0.0 if opts.singleton == "raw" else ret, baseline)
  return broadcast_tokens(r, jnp.where(live, adv, 0.0), r.outcome,
                          baseline=jnp.where(live, baseline, 0.0),
                          energy=jnp.where(live, energy, 0.0))


@register("optimal_token_baseline", OTBOptions, spec="4.4", group_normalised=True,
          loss=dict(aggregation="token_mean"),
          reference="tirjax.testing.reference.otb_gdpo:optimal_token_baseline")
def optimal_token_baseline(r: Rollouts, opts: OTBOptions) -> Advantages:
  """OTB: A_p = G_p − Σ_i G_p W_p / Σ_i W_p over the query's rows at response position p.

  verl's `optimal_token_baseline` (docs/algo/otb.md). G_p = R_out on every generated token
  (the reward-to-go of the outcome, which verl places on the last response token); W_p the
  energy accumulated over the row's generated tokens up to p. Position p: the offset from
  the row's first generated token, tool-response tokens included (a single-turn response's
  index; in multi-turn rows use `tir_optimal_token_baseline`).

  Decisions (verl's behaviour is an option where it differs; see `OTBOptions`):
  * the energy defaults to the sampled proxy 1 − π(a), since the trainer's samplers record no
    Σ_v π(v)² (`energy="sum_pi_squared"` is verl's, from `Rollouts.sum_pi_squared`);
  * spec §3: a group of one row gets 0 (verl: G), positions whose rows all have one return get
    exactly 0, and the zero tail is off; no eps in Σ W (verl: 1e-8);
  * the zero tail, when on, starts at the second-longest row's span (first to last generated
    token); verl compares with the count of generated tokens, which is the span on a
    single-turn row but shorter on a multi-turn one;
  * a row without generated tokens still counts in its group's size (as verl's).
  Worked example: two rows of two tokens, R = +1 and −1, energies w = (0.5, 0.5) and (1.5, 0),
  so W = (0.5, 1) and (1.5, 1.5): B_0 = (0.5 − 1.5)/2 = −0.5, B_1 = (1 − 1.5)/2.5 = −0.2;
  A = (1.5, 1.2) and (−0.5, −0.8). GRPO's mean baseline (0) would give (1, 1) and (−1, −1).
  """
  return optimal_baseline(r, opts, "response")


@register("tir_optimal_token_baseline", OTBOptions, spec="4.4", group_normalised=True,
          loss=dict(aggregation="token_mean"),
          reference="tirjax.testing.reference.otb_gdpo:tir_optimal_token_baseline")
def tir_optimal_token_baseline(r: Rollouts, opts: OTBOptions) -> Advantages:
  """TIR-OTB: OTB with positions counted over generated tokens only.

  verl's `tir_optimal_token_baseline` (`compute_multi_turn_optimal_token_baseline_advantage`;
  docs/algo/otb.md: B_t = E[G_t · W_t] / E[W_t]): each row's generated tokens are packed into
  a prefix (tool responses dropped), so the k-th policy token of every row shares a baseline
  whatever the tool responses between its turns. Rows without generated tokens are left out
  of their group (and of its size), as verl's. Decisions as `optimal_token_baseline`'s; the
  zero tail, when on, compares the rows' generated-token counts, exactly as verl's.
  """
  return optimal_baseline(r, opts, "generated")
