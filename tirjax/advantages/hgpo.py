"""HGPO: hierarchy-of-groups policy optimization, step credit over nested history groups
(spec §4.4).

He et al. 2026, "Hierarchy-of-Groups Policy Optimization for Long-Horizon Agentic Tasks"
(arXiv 2602.22817; code: github CazeroZ/hgpo `hgpo/core_hgpo.py`, the anonymous ICLR 2026
submission's, a fork of verl-agent). GiGPO (gigpo.py) compares steps that stand in the same
anchor state; HGPO notes that steps with the same current observation may have seen different
histories, and puts each step into nested groups G_0 ⊇ G_1 ⊇ … ⊇ G_K: G_k holds the steps of
the query whose current observation *and* k previous observations are the same. Each level
gives a relative advantage of the step's discounted return; the levels are averaged with
weights that grow with k:

  A_k(s)  = zscore of γ^(T−t) R_out among G_k(s)           (groups of >= 2 steps only)
  A^S(s)  = Σ_k w_k A_k(s) / Σ_k w_k,  w_k = (k + 1)^α     (over the levels s has)
  A(s)    = λ_E · A^E(τ) + A^S(s)

Conventions fixed here (docs/formulas.md "HGPO" lists them against the peer code):

* The *observation* of step t is what the environment showed just before it: the tokens of
  its row that are neither loss tokens nor padding and come after step t−1's generated
  tokens (for t = 0, the prompt). It is read from `Rollouts.tokens`, so no new contract field
  is needed; the kernel keys it by a 64-bit hash of (token, position in the observation) and
  its length, the loop reference by the token tuple itself (a hash collision would merge two
  observations; at 2^-64 per pair it is not guarded).
* Observations are compared within the query's group and across depths (a state revisited at
  another depth joins the group, as the peer's `anchor_obs` grouping does); level k needs
  t >= k (a step with fewer previous steps is not in G_k).
* History keys are the previous *observations* only, not the previous actions (the peer's).
* A level whose group has a single step gives no advantage; a step in no group of >= 2 steps
  gets A^S = 0 (spec §3). `drop_zero_levels` also leaves out levels whose advantage is exactly
  0 (the peer skips them; the paper's sum does not).
* λ_E (`episode_weight`) is 0 by default: the peer's trainer uses the step term alone.
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp

from tirjax import option_checks, segments
from tirjax.advantages.group import broadcast_steps, group_zscore
from tirjax.advantages.portool import outcome_terms
from tirjax.advantages.registry import Advantages, register
from tirjax.rollouts import Rollouts

_SEEDS = (0x9E3779B9, 0x85EBCA77)  # two independent 32-bit hashes make a 64-bit key
_ROUNDS = 6  # most hashing rounds of `key_ids` before its sorted fallback


@dataclasses.dataclass(frozen=True)
class HGPOOptions:
  """Defaults are the peer code's (K = 2, α = 1, "mean_norm", step term only) but γ, which is
  GiGPO's 0.95 (the peer reads its trainer's γ).

  Attributes:
    gamma: γ of the step's discounted return γ^(T_j − t) · R_out (t 1-based).
    history: K, the deepest level (previous observations shared).
    alpha: α of the level weights w_k = (k + 1)^α.
    zscore: conventions of each level's relative advantage; the peer's "mean_norm" is
      `scale="none"`, its "mean_std_norm" `ddof=0`.
    episode_weight: λ_E, the weight of the episode advantage A^E (GRPO's z-score of R_out).
    drop_zero_levels: leave out of the average the levels whose advantage is exactly 0.
  """

  gamma: float = 0.95
  history: int = 2
  alpha: float = 1.0
  zscore: segments.ZScore = segments.ZScore(scale="none")
  episode_weight: float = 0.0
  drop_zero_levels: bool = False

  def __post_init__(self):
    option_checks.lies_in("gamma", self.gamma, 0, 1)
    if not isinstance(self.history, int) or isinstance(self.history, bool) or self.history < 0:
      raise ValueError(f"history: must be an integer >= 0, got {self.history!r}")
    option_checks.finite_at_least("alpha", self.alpha, 0)
    option_checks.finite_at_least("episode_weight", self.episode_weight, 0)
    if not isinstance(self.drop_zero_levels, bool):
      raise ValueError(f"drop_zero_levels: must be a bool, got {self.drop_zero_levels!r}")
    if not isinstance(self.zscore, segments.ZScore):
      raise ValueError(f"zscore: must be a segments.ZScore, got {type(self.zscore).__name__}")


def _mix(h):
  """murmur3's 32-bit finaliser: spreads every input bit over the output."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def running_max(x: jax.Array) -> jax.Array:
  """Max of integers `x` [L, ...] up to and including each position of the leading axis
  (`lax.cummax` along axis 0), by a scan over the L positions: XLA:CPU lowers `cummax` to a
  windowed reduction that costs about L per entry, the scan one max per entry."""
  chex.assert_type(x, int)
  low = jnp.full(x.shape[1:], jnp.iinfo(x.dtype).min, x.dtype)
  return jax.lax.scan(lambda m, v: (jnp.maximum(m, v),) * 2, low, x)[1]


def observation_step(r: Rollouts):
  """Position-major [L, B]: the step whose observation each token is (1 + the last step
  generated before it), the observation tokens (real, outside the loss), and each token's rank
  in its observation (its distance to the last generated token before it)."""
  L, B = r.max_tokens, r.num_rows
  loss = r.loss_mask.T
  pos = jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32)[:, None], (L, B))
  # one scan for both running maxima: the last step generated so far, and where the
  # observation starts (it is contiguous and starts after the last generated token before it)
  last = running_max(jnp.stack([r.token_step.T, jnp.where(loss, pos + 1, 0)], axis=1))
  obs = r.token_valid.T & ~loss & r.row_valid[None, :]
  return last[:, 0] + 1, obs, (pos - last[:, 1]).astype(jnp.uint32)


def observation_keys(r: Rollouts):
  """[B, T, 3] uint32 (hash 1, hash 2, length) of each step's observation.

  Computed position-major ([L, B]: the scan of `observation_step` reads a contiguous row per
  position); the sums wrap mod 2^32, so the order in which tokens are added is immaterial."""
  B, T, L = r.num_rows, r.max_steps, r.max_tokens
  obs_step, obs, rank = observation_step(r)
  obs = obs & (obs_step < T)
  ids = jnp.arange(B)[None, :] * T + jnp.clip(obs_step, 0, T - 1)
  tok = r.tokens.T.astype(jnp.uint32)
  hashes = [_mix(_mix(tok * jnp.uint32(0x27D4EB2F) + jnp.uint32(seed)) ^ (rank * jnp.uint32(seed)))
            for seed in _SEEDS]
  # computed once, not inside the fused copy that feeds the scatter (XLA:CPU fused them, and
  # was slower)
  hashes = jax.lax.optimization_barrier(hashes)
  parts = jnp.where(obs[..., None], jnp.stack(hashes + [jnp.ones_like(tok)], axis=-1),
                    jnp.uint32(0))
  sums = jax.ops.segment_sum(parts.reshape(L * B, 3), ids.ravel(), B * T)  # wraps mod 2^32
  return sums.reshape(B, T, 3)


def sorted_ids(columns, mask):
  """Ids in [0, N) of the distinct keys `columns` (each [N]) among `mask`'s entries, by a
  lexicographic sort: equal keys, equal ids. Exact, and slow on CPU (a multi-key sort of N
  entries); `key_ids` calls it only when hashing left a key unplaced."""
  chex.assert_equal_shape([*columns, mask])
  n = mask.shape[0]
  order = jnp.lexsort(tuple(reversed(columns)) + (~mask,))  # masked entries sort last
  cols = [c[order] for c in columns]
  change = jnp.zeros(n, bool).at[1:].set(
      jnp.any(jnp.stack([c[1:] != c[:-1] for c in cols]), axis=0))
  ids = jnp.cumsum(change).astype(jnp.int32)
  return jnp.zeros(n, jnp.int32).at[order].set(ids)


def key_ids(columns, mask, rounds: int = _ROUNDS):
  """Ids in [0, N) of the distinct keys `columns` (each [N] integers) among `mask`'s entries:
  equal keys, equal ids; 0 on masked entries.

  A key's id is the index of one entry holding it (its representative). Each round hashes the
  keys still unplaced into 8N buckets, takes the lowest-index entry of each bucket as its
  representative and places every entry whose key equals its representative's (compared
  exactly, column by column): a bucket shared by two keys places one of them and leaves the
  other to the next round's hash. If any key is still unplaced after `rounds` (at load 1/8,
  about N · 8^-rounds keys), every key is renumbered by `sorted_ids` instead: exact either way.
  """
  chex.assert_equal_shape([*columns, mask])
  n = mask.shape[0]
  cols = [c.astype(jnp.uint32) for c in columns]
  index = jnp.arange(n, dtype=jnp.int32)
  buckets = 8 * n

  def place(state):
    r, ids, todo = state
    salt = r.astype(jnp.uint32) * jnp.uint32(0x9E3779B9)
    h = jnp.full(n, 0x811C9DC5, jnp.uint32) ^ salt
    for c in cols:
      h = _mix(h ^ _mix(c ^ salt))
    bucket = jnp.where(todo, (h % jnp.uint32(buckets)).astype(jnp.int32), buckets)
    rep = jax.ops.segment_min(jnp.where(todo, index, n), bucket, buckets + 1)
    rep = jnp.clip(rep[bucket], 0, n - 1)
    same = todo & jnp.all(jnp.stack([c[rep] == c for c in cols]), axis=0)
    return r + 1, jnp.where(same, rep, ids), todo & ~same

  # rounds run while some key is unplaced, at most `rounds` (usually 2 or 3)
  _, ids, todo = jax.lax.while_loop(lambda s: (s[0] < rounds) & jnp.any(s[2]), place,
                                    (jnp.int32(0), jnp.zeros(n, jnp.int32), mask))
  return jax.lax.cond(jnp.any(todo), lambda: jnp.where(mask, sorted_ids(columns, mask), 0),
                      lambda: ids)


def level_ids(r: Rollouts, history: int):
  """[history + 1] pairs ([B, T] id of G_k, [B, T] steps in level k): level k keys a step by
  its query, its observation and its k previous observations (steps with t >= k only).

  Observations are keyed by their (hash 1, hash 2, length) columns directly, not by ids of
  their own: the same partition, one `key_ids` pass fewer."""
  B, T = r.num_rows, r.max_steps
  valid = r.step_valid & r.row_valid[:, None]
  keys = observation_keys(r)  # [B, T, 3]
  group = jnp.broadcast_to(r.group_id[:, None], (B, T)).ravel()
  ids = key_ids([group] + [keys[:, :, c].ravel() for c in range(3)], valid.ravel())
  depth = jnp.broadcast_to(jnp.arange(T)[None, :], (B, T))
  out = [(ids.reshape(B, T), valid)]
  for k in range(1, history + 1):
    if k >= T:
      break  # no step has k previous steps
    # step t − k of the row (valid wherever t is: a row's valid steps are a prefix)
    earlier = jnp.concatenate([jnp.zeros((B, k, 3), jnp.uint32), keys[:, :-k]], axis=1)
    in_level = valid & (depth >= k)
    ids = key_ids([ids] + [earlier[:, :, c].ravel() for c in range(3)], in_level.ravel())
    out.append((ids.reshape(B, T), in_level))
  return out


def hierarchy_advantage(ret, levels, opts: HGPOOptions):
  """A^S = Σ_k w_k A_k / Σ_k w_k over the levels whose group has >= 2 steps; 0 with none.
  Also returns [B, T] the number of levels that entered."""
  num = jnp.zeros_like(ret)
  den = jnp.zeros_like(ret)
  used = jnp.zeros(ret.shape, jnp.int32)
  n = ret.size
  for k, (ids, mask) in enumerate(levels):
    a = segments.zscore(ret, ids, mask, n, opts.zscore)
    size = segments.gather(segments.segment_count(ids, mask, n), ids)
    enters = mask & (size >= 2)
    if opts.drop_zero_levels:
      enters = enters & (a != 0)
    w = float(k + 1) ** opts.alpha
    num = num + jnp.where(enters, w * a, 0.0)
    den = den + jnp.where(enters, w, 0.0)
    used = used + enters.astype(jnp.int32)
  return jnp.where(den > 0, num / jnp.maximum(den, 1e-30), 0.0), used


@register("hgpo", HGPOOptions, spec="4.4",
          reference="tirjax.testing.reference.hgpo:hgpo")
def hgpo(r: Rollouts, opts: HGPOOptions) -> Advantages:
  """HGPO: A(s) = λ_E · A^E(τ) + Σ_k w_k A_k(s) / Σ_k w_k over s's nested history groups."""
  ret = outcome_terms(r, opts.gamma)
  levels = level_ids(r, opts.history)
  step, used = hierarchy_advantage(ret, levels, opts)
  episode = group_zscore(r, r.outcome, segments.ZScore())
  steps = opts.episode_weight * episode[:, None] + step
  row_adv = opts.episode_weight * episode
  return broadcast_steps(r, steps, row_adv, r.outcome, step_return=ret, step_advantage=step,
                         levels_used=jnp.where(r.step_valid, used, 0).astype(jnp.float32))
