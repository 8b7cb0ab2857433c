"""PPO with a learned critic: token-level GAE (`ppo`) and turn-level GAE (`turn_ppo`) (spec §4.4).

Both read the critic's values `Rollouts.values` [B, L] (V of the prefix before each token) and
return, beside the policy's token advantages, the critic's targets: `extras["returns"]` [B, L]
(the λ-returns G = A + V, before whitening) on `extras["value_mask"]` [B, L] (the tokens whose
value the critic's loss fits, `tirjax.loss.value`), and `extras["values"]`, the values read.

Token-level GAE (`ppo`; Schulman et al. 2016, "High-Dimensional Continuous Control Using
Generalized Advantage Estimation", Eq. 16; verl's `compute_gae_advantage_return`). Over the
loss tokens p_1 < … < p_n of row b (its own tokens; prompt and tool-response tokens are the
environment's, not actions):

    r_i = R_out · [i = n]                    the outcome on the row's last loss token
    δ_i = r_i + γ · V(p_{i+1}) − V(p_i)      V(p_{n+1}) = 0 (the episode ends)
    A_i = δ_i + γλ · A_{i+1}                 A_{n+1} = 0
    G_i = A_i + V(p_i)

Tool-response tokens (non-loss tokens inside the row) are skipped by the recursion: they
neither discount nor carry a TD error, and the value after a step's last token is the value
at the next step's first token, which sees the tool response. verl's loop does the same
("skip values and TD-error on observation tokens": at a token outside `response_mask` it
carries `nextvalues` and `lastgaelam` unchanged); it also writes the carried advantage on
those tokens, which are out of the loss; here they are 0. Limits: λ = 1, γ = 1 gives
A_i = R_out − V(p_i) (the return minus the value); λ = 0 gives the TD error δ_i.

Turn-level GAE (`turn_ppo`; Li et al. 2025, "Turn-PPO", arXiv 2512.17008: a turn-level MDP
whose state s_h is the history before turn h's output and whose action a_h is that whole
output). Over the row's turns h_1 < … < h_m (valid steps with at least one loss token):

    V_k = V(s_{h_k}) = values at turn h_k's first loss token   (the turn boundary)
    r_k = R_out · [k = m]
    δ_k = r_k + γ · V_{k+1} − V_k,   V_{m+1} = 0
    A_k = δ_k + γλ · A_{k+1},        G_k = A_k + V_k

and A_k is broadcast to every loss token of turn h_k. Choices where the paper leaves room,
declared: the value of a turn is read at its first generated token (the critic's output on
the last token of the turn's input: the history and the tool response before it); a step
without loss tokens is no turn (skipped, like a tool response); the critic fits G_k at the
turn boundary only (`value_mask`: one target per turn); the reward is the outcome alone (no
per-turn reward; R_fm is not used, as in `ppo`). Turn-PPO's turn-level importance ratio and
clipping belong to the policy loss, not to the estimator, and are not part of this.

Whitening (`whiten=True`, the default; verl always whitens GAE): the advantages are z-scored
over the batch's loss tokens with spec §3's conventions ((x − mean)/(std + eps), ddof 1;
verl: (x − mean)·rsqrt(var + 1e-8)), so a batch whose advantages are all equal gets 0. The
returns are never whitened.

Trees. A tree's shared prefix carries one value: every row through a node reads the values
of the node's lowest row (rows that share a node share its tokens at the same positions, so a
critic computes one value there). The rows below a node continue differently, so their GAE
differs there; `shared_prefix="mean"` (the default) gives each shared token (token level) or
turn (turn level) the mean of the rows' A and G through it (one advantage and one critic
target per shared token, the Monte Carlo mean over the leaves below; with token-mean
aggregation the loss's gradient is that of "own", whose unclipped sum over the copies is the
same), `"own"` keeps each row's own. On independent rows the two are the same.

Vectorised: each recursion is a first-order linear recurrence x_t = a_t · x_{t+1} + b_t, run
as a reversed `lax.associative_scan` over the padded [B, L] (or [B, T]) arrays; masked
positions have a = 1, b = 0 (they carry). No loop over rows, tokens or nodes.
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp

from tirjax import option_checks, segments
from tirjax.advantages.group import broadcast_tokens
from tirjax.advantages.registry import Advantages, register
from tirjax.rollouts import Rollouts, step_to_tokens

_SHARED_PREFIX = ("mean", "own")


def needs_critic(name: str) -> bool:
  """The registered estimator `name` reads a critic's values (`Rollouts.values`). The trainer
  trains a value model for them (`tirjax.train_steps.critic`); the credit bench and the
  fidelity runs have none yet, so they leave such estimators out."""
  from tirjax.advantages import registry  # pylint: disable=import-outside-toplevel
  return "values" in registry.get(name).needs


def without_critics(names) -> list[str]:
  """`names` less the estimators that read a critic's values (`needs_critic`)."""
  return [n for n in names if not needs_critic(n)]


def reverse_linear_scan(a: jax.Array, b: jax.Array, axis: int = 1) -> jax.Array:
  """x_t = a_t · x_{t+1} + b_t along `axis`, with x = 0 past the end (a reversed associative
  scan: the composition of the affine maps x ↦ a·x + b from the end backwards)."""
  chex.assert_equal_shape([a, b])

  def combine(later, earlier):
    # `later` maps x_end to x_{t+1}; `earlier` is (a_t, b_t): compose to x_end ↦ x_t.
    (a1, b1), (a2, b2) = later, earlier
    return a2 * a1, a2 * b1 + b2

  return jax.lax.associative_scan(combine, (a, b), reverse=True, axis=axis)[1]


def representative_rows(r: Rollouts) -> jax.Array:
  """[B, L] int32: the row whose value a token reads. A loss token of step s reads the lowest
  row through the node of s (one value per shared prefix); other tokens read their own row."""
  B, T = r.num_rows, r.max_steps
  rows = jnp.broadcast_to(jnp.arange(B, dtype=jnp.int32)[:, None], (B, T))
  lowest = segments.segment_min(rows, r.node_id, r.step_valid, B * T, empty=B).astype(jnp.int32)
  node_rep = jnp.where(r.step_valid, segments.gather(lowest, r.node_id), rows)  # [B, T]
  idx = jnp.clip(r.token_step, 0, T - 1)
  tok_rep = jnp.take_along_axis(node_rep, idx, axis=1)
  own = jnp.broadcast_to(jnp.arange(B, dtype=jnp.int32)[:, None], r.token_step.shape)
  return jnp.where(r.token_step >= 0, tok_rep, own).astype(jnp.int32)


def read_values(r: Rollouts, name: str) -> jax.Array:
  """[B, L] f32 the critic's values, a shared prefix's read from its lowest row."""
  if r.values is None:
    raise ValueError(f"{name}: the batch has no values (Rollouts.values, the critic's V of the "
                     "prefix before each token); it needs a value model")
  chex.assert_equal_shape([r.values, r.loss_mask])
  rep = representative_rows(r)
  positions = jnp.broadcast_to(jnp.arange(r.max_tokens)[None, :], rep.shape)
  return r.values.astype(jnp.float32)[rep, positions]


def last_of(mask: jax.Array, axis: int = 1) -> jax.Array:
  """bool: the last True entry of `mask` along `axis`."""
  after = jnp.flip(jnp.cumsum(jnp.flip(mask, axis), axis=axis), axis)  # Trues at or after t
  return mask & (after == 1)


def gae(values: jax.Array, reward: jax.Array, live: jax.Array, gamma: float,
        lam: float) -> tuple[jax.Array, jax.Array]:
  """(A, G) [N, S]: GAE over the `live` positions of each row, the others skipped.

  δ_t = reward_t + γ · V(next live position) − V_t (0 past the last), A_t = δ_t + γλ · A at
  the next live position, G_t = A_t + V_t; both 0 off `live`.
  """
  chex.assert_equal_shape([values, reward, live])
  chex.assert_rank(values, 2)
  chex.assert_type(live, bool)
  v = jnp.where(live, values, 0.0)
  # W_t: the value at the first live position at or after t; the next value is W_{t+1}.
  first_after = reverse_linear_scan(jnp.where(live, 0.0, 1.0), v)
  next_value = jnp.concatenate([first_after[:, 1:], jnp.zeros_like(first_after[:, :1])], 1)
  delta = jnp.where(live, reward + gamma * next_value - v, 0.0)
  adv = reverse_linear_scan(jnp.where(live, gamma * lam, 1.0), delta)
  adv = jnp.where(live, adv, 0.0)
  return adv, jnp.where(live, adv + v, 0.0)


def _shared_token_mean(x: jax.Array, r: Rollouts, live: jax.Array) -> jax.Array:
  """[B, L] the mean of `x` over the copies of each token (rows through its node, same
  position), read back at every copy; keyed by (representative row, position)."""
  B, L = x.shape
  ids = representative_rows(r) * L + jnp.arange(L, dtype=jnp.int32)[None, :]
  mean = segments.segment_mean(x, ids, live, B * L)
  return jnp.where(live, segments.gather(mean, ids), 0.0)


def _finish(r: Rollouts, adv, returns, values, value_mask, live, opts) -> Advantages:
  tokens = segments.whiten(adv, live, opts.zscore) if opts.whiten else adv
  return broadcast_tokens(r, tokens, r.outcome, returns=jnp.where(value_mask, returns, 0.0),
                          value_mask=value_mask, values=jnp.where(live, values, 0.0))


@dataclasses.dataclass(frozen=True)
class PPOOptions:
  """Attributes:
    gamma: γ of the token-level return (verl's default 1).
    lam: λ of GAE (verl's default 1).
    whiten: z-score the advantages over the batch's loss tokens (verl always does).
    zscore: the whitening's conventions (spec §3).
    shared_prefix: a tree's shared token gets the "mean" of the rows' A and G through it,
      or each row its "own".
  """

  gamma: float = 1.0
  lam: float = 1.0
  whiten: bool = True
  zscore: segments.ZScore = segments.ZScore()
  shared_prefix: str = "mean"

  def __post_init__(self):
    option_checks.lies_in("gamma", self.gamma, 0, 1)
    option_checks.lies_in("lam", self.lam, 0, 1)
    if not isinstance(self.whiten, bool):
      raise ValueError(f"whiten: must be a bool, got {self.whiten!r}")
    if not isinstance(self.zscore, segments.ZScore):
      raise ValueError(f"zscore: must be a segments.ZScore, got {type(self.zscore).__name__}")
    option_checks.one_of("shared_prefix", self.shared_prefix, _SHARED_PREFIX)


@dataclasses.dataclass(frozen=True)
class TurnPPOOptions(PPOOptions):
  """`PPOOptions` at the turn level, with Turn-PPO's γ = 0.99 and λ = 0.9 (its best).

  Attributes:
    gamma: γ of the turn-level return (Turn-PPO's 0.99).
    lam: λ of GAE over turns (Turn-PPO's 0.9).
    whiten: z-score the advantages over the batch's loss tokens (verl always does).
    zscore: the whitening's conventions (spec §3).
    shared_prefix: a tree's shared turn gets the "mean" of the rows' A and G through it,
      or each row its "own".
  """

  gamma: float = 0.99
  lam: float = 0.9


def token_gae(r: Rollouts, opts: PPOOptions, name: str = "ppo"):
  """(A, G, V, live) [B, L] of token-level GAE before whitening (see the module docstring)."""
  live = r.loss_mask & r.row_valid[:, None]
  values = read_values(r, name)
  reward = jnp.where(last_of(live), r.outcome[:, None], 0.0)
  adv, returns = gae(values, reward, live, opts.gamma, opts.lam)
  if opts.shared_prefix == "mean":
    adv, returns = _shared_token_mean(adv, r, live), _shared_token_mean(returns, r, live)
  return adv, returns, values, live


@register("ppo", PPOOptions, spec="4.4", needs=("values",),
          reference="tirjax.testing.reference.critic:ppo")
def ppo(r: Rollouts, opts: PPOOptions) -> Advantages:
  """PPO's token-level GAE: A_i = Σ_k (γλ)^k δ_{i+k} over the row's loss tokens, δ_i =
  r_i + γ V_{i+1} − V_i, r = R_out on the last one; whitened over the batch's loss tokens.

  Schulman et al. 2017 (PPO) with GAE (Schulman et al. 2016, Eq. 16); verl's
  `compute_gae_advantage_return`. The critic's targets G = A + V are `extras["returns"]` on
  `extras["value_mask"]` (the loss tokens).
  """
  adv, returns, values, live = token_gae(r, opts)
  return _finish(r, adv, returns, values, live, live, opts)


def turn_gae(r: Rollouts, opts: PPOOptions, name: str = "turn_ppo"):
  """Turn-level GAE before whitening: (A [B, T], G [B, T], V [B, T], turn [B, T] bool,
  boundary [B, L] bool, the first loss token of each turn)."""
  B, T, L = r.num_rows, r.max_steps, r.max_tokens
  live = r.loss_mask & r.row_valid[:, None]
  values = read_values(r, name)
  pos = jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32)[None, :], (B, L))
  ids = jnp.arange(B, dtype=jnp.int32)[:, None] * T + jnp.clip(r.token_step, 0, T - 1)
  first = segments.segment_min(pos, ids, live, B * T, empty=L).astype(jnp.int32).reshape(B, T)
  turn = r.step_valid & (first < L)
  boundary = live & (segments.gather(first.reshape(-1), ids) == pos)
  v_turn = jnp.where(turn, jnp.take_along_axis(values, jnp.minimum(first, L - 1), axis=1), 0.0)
  reward = jnp.where(last_of(turn), r.outcome[:, None], 0.0)
  adv, returns = gae(v_turn, reward, turn, opts.gamma, opts.lam)
  if opts.shared_prefix == "mean":
    num_nodes = B * T
    adv = jnp.where(turn, segments.gather(
        segments.segment_mean(adv, r.node_id, turn, num_nodes), r.node_id), 0.0)
    returns = jnp.where(turn, segments.gather(
        segments.segment_mean(returns, r.node_id, turn, num_nodes), r.node_id), 0.0)
  return adv, returns, v_turn, turn, boundary


@register("turn_ppo", TurnPPOOptions, spec="4.4", needs=("values",),
          reference="tirjax.testing.reference.critic:turn_ppo")
def turn_ppo(r: Rollouts, opts: TurnPPOOptions) -> Advantages:
  """Turn-PPO's turn-level GAE: A_k = Σ_j (γλ)^j δ_{k+j} over the row's turns, δ_k =
  r_k + γ V(s_{k+1}) − V(s_k), V(s_k) read at turn k's first loss token, r = R_out on the last
  turn; A_k broadcast to the turn's tokens, then whitened over the batch's loss tokens.

  Li et al. 2025 (arXiv 2512.17008), the turn-level MDP with GAE over turns. The critic's
  targets G_k = A_k + V(s_k) are `extras["returns"]` on `extras["value_mask"]` (each turn's
  first loss token).
  """
  adv, returns, _, _, boundary = turn_gae(r, opts)
  live = r.loss_mask & r.row_valid[:, None]
  adv_tokens = jnp.where(live, step_to_tokens(adv, r.token_step), 0.0)
  ret_tokens = jnp.where(live, step_to_tokens(returns, r.token_step), 0.0)
  return _finish(r, adv_tokens, ret_tokens, read_values(r, "turn_ppo"), boundary, live, opts)
