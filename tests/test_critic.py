"""PPO's critic-based estimators (`ppo`: token-level GAE, `turn_ppo`: turn-level GAE) and the
clipped value loss, against their loop references (tirjax/testing/reference/critic.py), with
their limits, degenerate rows, trees, and two injected faults that the reference check must
catch (a time-reversed recursion, values read one token late)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, strategies as st

from tirjax import advantages, segments
from tirjax.advantages import critic
from tirjax.advantages.critic import PPOOptions, TurnPPOOptions
from tirjax.loss import stats
from tirjax.loss.aggregation import AGGREGATIONS
from tirjax.loss.value import value_loss
from tirjax.rollouts import to_numpy
from tirjax.testing.critic_values import prefix_value_array, with_values
from tirjax.testing.estimator_checks import (check_padding, check_reference, option_fields,
                                             check_row_permutation)
from tirjax.testing.records import GroupRecord, RowRecord, StepRecord, build_rollouts
from tirjax.testing.reference import REFERENCES, critic as ref
from tirjax.testing.strategies import tree_batches

VARIANTS = (
    ("ppo", PPOOptions()),
    ("ppo", PPOOptions(gamma=0.9, lam=0.7, whiten=False)),
    ("ppo", PPOOptions(gamma=0.8, lam=0.5, whiten=False, shared_prefix="own")),
    ("ppo", PPOOptions(zscore=segments.ZScore(ddof=0), shared_prefix="own")),
    ("turn_ppo", TurnPPOOptions()),
    ("turn_ppo", TurnPPOOptions(whiten=False)),
    ("turn_ppo", TurnPPOOptions(gamma=0.7, lam=0.3, whiten=False, shared_prefix="own")),
)
NAMES = ("ppo", "turn_ppo")
RAW = dict(whiten=False, shared_prefix="own")


def run(name, r, opts):
  """The kernel itself, not jitted: so that a monkeypatched helper takes effect."""
  return (critic.ppo if name == "ppo" else critic.turn_ppo)(r, opts)


def matches_reference(r, name, opts, fn=run) -> bool:
  out = fn(name, r, opts)
  want = REFERENCES[name](to_numpy(r), **option_fields(opts))
  return all(np.allclose(np.asarray(x), y, atol=2e-5, rtol=1e-5) for x, y in (
      (out.tokens, want["tokens"]), (out.extras["returns"], want["returns"]),
      (out.extras["value_mask"], want["value_mask"])))


@given(tree_batches(), st.integers(0, 2**31 - 1))
def test_reference_row_permutation_and_padding(r, seed):
  """Every variant against its loop reference (advantages, critic targets and their mask) on
  rows and trees; rows reordered, outputs reordered; padding changes nothing."""
  r = with_values(r, seed % 1000)
  check_reference(r, VARIANTS)
  for name, opts in VARIANTS:
    assert matches_reference(r, name, opts), (name, opts)
  check_row_permutation(r, seed, NAMES, "tokens")
  check_padding(r, seed, NAMES, "tokens")


@given(tree_batches(), st.integers(0, 999))
def test_limits(r, seed):
  """λ = 1, γ = 1: A = R_out − V at every loss token (the return minus the value); λ = 0: the
  TD error δ; γ = 0: r − V; the same at the turn level with turn values; G = A + V always."""
  r = with_values(r, seed)
  b = to_numpy(r)
  live = b["loss_mask"] & b["row_valid"][:, None]
  values = b["values"]
  R = np.broadcast_to(b["outcome"][:, None], live.shape)
  last = live & (np.cumsum(live[:, ::-1], 1)[:, ::-1] == 1)
  out = run("ppo", r, PPOOptions(gamma=1.0, lam=1.0, **RAW))
  np.testing.assert_allclose(np.asarray(out.tokens)[live], (R - values)[live], atol=1e-5)
  np.testing.assert_allclose(np.asarray(out.extras["returns"])[live], R[live], atol=1e-5)
  out = run("ppo", r, PPOOptions(gamma=0.0, lam=0.5, **RAW))
  np.testing.assert_allclose(np.asarray(out.tokens)[live], np.where(last, R, 0)[live]
                             - values[live], atol=1e-5)
  gamma = 0.9
  out = run("ppo", r, PPOOptions(gamma=gamma, lam=0.0, **RAW))
  for row in range(r.num_rows):
    pos = np.flatnonzero(live[row])
    nxt = np.append(values[row, pos[1:]], 0.0)
    delta = np.where(last[row, pos], R[row, pos], 0) + gamma * nxt - values[row, pos]
    np.testing.assert_allclose(np.asarray(out.tokens)[row, pos], delta, atol=1e-5)
  # Turn level: V_k at each turn's first loss token.
  out = run("turn_ppo", r, TurnPPOOptions(gamma=1.0, lam=1.0, **RAW))
  boundary = np.asarray(out.extras["value_mask"])
  np.testing.assert_allclose(np.asarray(out.extras["returns"])[boundary], R[boundary],
                             atol=1e-5)
  out0 = run("turn_ppo", r, TurnPPOOptions(gamma=gamma, lam=0.0, **RAW))
  for row in range(r.num_rows):
    firsts = np.flatnonzero(boundary[row])
    v = values[row, firsts]
    delta = gamma * np.append(v[1:], 0.0) - v
    if len(firsts):
      delta[-1] += R[row, 0]
    np.testing.assert_allclose(np.asarray(out0.tokens)[row, firsts], delta, atol=1e-5)


def tool_row(values=None):
  """One row: prompt (1), step 0 tokens (4, 5), tool response (9, 9, 9), step 1 token (6)."""
  row = RowRecord(outcome=1, steps=[StepRecord(tokens=(4, 5), response_tokens=(9, 9, 9)),
                                    StepRecord(tokens=(6,))])
  r = build_rollouts([GroupRecord(rows=[row])])
  v = np.zeros(r.tokens.shape, np.float32)
  v[0, :7] = values if values is not None else [9.0, 0.1, 0.2, 7.0, 7.0, 7.0, 0.4]
  return r.replace(values=jnp.asarray(v))


def test_tool_response_tokens_are_skipped():
  """Loss tokens at 1, 2 and 6, tool response at 3-5: γ = 0.5, λ = 0.5, R = 1 by hand; the
  values at the prompt and the tool response change nothing."""
  r = tool_row()
  np.testing.assert_array_equal(np.flatnonzero(np.asarray(r.loss_mask)[0]), [1, 2, 6])
  g, lam = 0.5, 0.5
  d6 = 1.0 - 0.4
  d2 = g * 0.4 - 0.2
  d1 = g * 0.2 - 0.1
  a6, a2 = d6, d2 + g * lam * d6
  a1 = d1 + g * lam * a2
  out = run("ppo", r, PPOOptions(gamma=g, lam=lam, **RAW))
  np.testing.assert_allclose(np.asarray(out.tokens)[0, [1, 2, 6]], [a1, a2, a6], atol=1e-6)
  np.testing.assert_allclose(np.asarray(out.extras["returns"])[0, [1, 2, 6]],
                             [a1 + 0.1, a2 + 0.2, a6 + 0.4], atol=1e-6)
  other = run("ppo", tool_row([-3.0, 0.1, 0.2, 1.0, -2.0, 5.0, 0.4]),
              PPOOptions(gamma=g, lam=lam, **RAW))
  np.testing.assert_allclose(other.tokens, out.tokens)
  # Turn level: turns start at 1 and 6; V = 0.1, 0.4; A_1 = 1 − 0.4, A_0 = δ_0 + γλ A_1.
  t = run("turn_ppo", r, TurnPPOOptions(gamma=g, lam=lam, **RAW))
  b1 = 1.0 - 0.4
  b0 = g * 0.4 - 0.1 + g * lam * b1
  np.testing.assert_allclose(np.asarray(t.tokens)[0, [1, 2, 6]], [b0, b0, b1], atol=1e-6)
  np.testing.assert_array_equal(np.flatnonzero(np.asarray(t.extras["value_mask"])[0]), [1, 6])


def test_degenerate_rows():
  """A row without steps and a padding row get nothing; a single-token row gets R − V for
  any γ and λ; whitening a batch of one token gives 0 (spec §3's singleton)."""
  rows = [RowRecord(outcome=-1, steps=[]),
          RowRecord(outcome=1, steps=[StepRecord(tokens=(4,))])]
  r = build_rollouts([GroupRecord(rows=rows)], num_rows=3)
  r = with_values(r, 3)
  v = np.asarray(r.values)
  pos = np.flatnonzero(np.asarray(r.loss_mask)[1])
  assert len(pos) == 1
  for name, opts in (("ppo", PPOOptions(gamma=0.3, lam=0.6, **RAW)),
                     ("turn_ppo", TurnPPOOptions(**RAW))):
    out = run(name, r, opts)
    tokens = np.asarray(out.tokens)
    assert not tokens[[0, 2]].any() and not np.asarray(out.extras["returns"])[[0, 2]].any()
    np.testing.assert_allclose(tokens[1, pos], 1.0 - v[1, pos], atol=1e-6)
    whitened = run(name, r, type(opts)(whiten=True))
    assert not np.asarray(whitened.tokens).any()
    assert all(np.isfinite(np.asarray(x)).all() for x in (out.tokens, out.rows, out.steps))


def test_a_batch_without_values_is_refused_by_name():
  r = tool_row().replace(values=None)
  for name in NAMES:
    with pytest.raises(ValueError, match="values"):
      advantages.get(name)(r)
    assert advantages.get(name).needs == ("values",)


def shared_tree():
  """Two rows sharing their first step (node "a"), then branching; outcomes +1 and −1."""
  rows = [RowRecord(outcome=1, steps=[StepRecord(node="a", tokens=(4, 5), response_tokens=(9,)),
                                      StepRecord(node="b", tokens=(6, 7))]),
          RowRecord(outcome=-1, steps=[StepRecord(node="a", tokens=(4, 5), response_tokens=(9,)),
                                       StepRecord(node="c", tokens=(8,))])]
  r = build_rollouts([GroupRecord(rows=rows)])
  return with_values(r, 5)


def test_a_shared_prefix_carries_one_value_and_one_advantage():
  """The second row's values on the shared step are never read (its lowest row's are); with
  "mean" both rows carry one advantage and one return there, the mean of their "own"."""
  r = shared_tree()
  shared = np.asarray(r.token_step)[0] == 0
  v = np.array(r.values)
  v[1, shared] += 3.0
  moved = r.replace(values=jnp.asarray(v))
  for name, opts in (("ppo", PPOOptions(gamma=0.9, lam=0.8, whiten=False)),
                     ("turn_ppo", TurnPPOOptions(whiten=False))):
    a, b = run(name, r, opts), run(name, moved, opts)
    np.testing.assert_allclose(a.tokens, b.tokens, atol=1e-6)
    np.testing.assert_allclose(a.extras["returns"], b.extras["returns"], atol=1e-6)
    tokens = np.asarray(a.tokens)
    np.testing.assert_allclose(tokens[0, shared], tokens[1, shared], atol=1e-6)
    own = np.asarray(run(name, r, type(opts)(gamma=opts.gamma, lam=opts.lam, **RAW)).tokens)
    assert not np.allclose(own[0, shared], own[1, shared])
    np.testing.assert_allclose(tokens[0, shared], own[:, shared].mean(0), atol=1e-6)


def forward_scan(a, b, axis=1):
  """Fault: the recursion run forwards in time (x_t = a_t · x_{t−1} + b_t)."""
  def combine(earlier, later):
    (a1, b1), (a2, b2) = earlier, later
    return a2 * a1, a2 * b1 + b2
  return jax.lax.associative_scan(combine, (a, b), axis=axis)[1]


def late_values(read_values):
  """Fault: values read one token late (the critic's output at the token, not before it)."""
  def read(r, name):
    v = read_values(r, name)
    return jnp.concatenate([v[:, 1:], jnp.zeros_like(v[:, :1])], axis=1)
  return read


@pytest.mark.parametrize("fault", ["time_reversed", "values_on_wrong_tokens"])
def test_injected_faults_fail_the_reference_check(monkeypatch, fault):
  """Both faults are caught on random multi-step batches, for both estimators (and the same
  batches pass without them)."""
  rng = np.random.default_rng(0)
  from tirjax.testing import synthetic  # noqa: PLC0415
  paths = synthetic.tree_paths(rng, [4, 3], branching=2, max_depth=3, finish_prob=0.3)
  r = synthetic.to_rollouts(rng, paths, num_rows=8, max_steps=3, max_calls=2, max_gt_calls=2)
  r = with_values(r, 7)
  variants = [("ppo", PPOOptions(gamma=0.9, lam=0.8, whiten=False)),
              ("turn_ppo", TurnPPOOptions(whiten=False))]
  for name, opts in variants:
    assert matches_reference(r, name, opts)
  if fault == "time_reversed":
    monkeypatch.setattr(critic, "reverse_linear_scan", forward_scan)
  else:
    monkeypatch.setattr(critic, "read_values", late_values(critic.read_values))
  for name, opts in variants:
    assert not matches_reference(r, name, opts), (fault, name)


@given(st.integers(0, 2**31 - 1), st.sampled_from(AGGREGATIONS),
       st.sampled_from([None, 0.2, 1.0]))
def test_value_loss_against_reference_and_micro_batches(seed, aggregation, clip):
  """(sum, den) and the clip fraction against the loop; any split of the rows into two
  micro-batches sums to the same (sum, den)."""
  rng = np.random.default_rng(seed)
  B, L = int(rng.integers(1, 6)), int(rng.integers(1, 9))
  mask = rng.random((B, L)) < rng.choice([0.0, 0.5, 1.0])
  v, old, g = (rng.normal(size=(B, L)).astype(np.float32) for _ in range(3))
  kwargs = dict(cliprange_value=clip, aggregation=aggregation,
                norm_constant=8.0 if aggregation == "seq_mean_token_sum_norm" else None)
  out = value_loss(jnp.asarray(v), jnp.asarray(old), jnp.asarray(g), jnp.asarray(mask), **kwargs)
  want = ref.value_loss(v, old, g, mask, **kwargs)
  np.testing.assert_allclose(float(out.loss.sum), want["sum"], rtol=1e-5, atol=1e-5)
  assert float(out.loss.den) == want["den"]
  np.testing.assert_allclose(float(out.clipfrac.value), want["clipfrac"], atol=1e-6)
  cut = int(rng.integers(0, B + 1))
  parts = [value_loss(*(jnp.asarray(x[s]) for x in (v, old, g, mask)), **kwargs)
           for s in (slice(0, cut), slice(cut, B)) if len(range(B)[s])]
  merged = stats.Mean(sum(p.loss.sum for p in parts), sum(p.loss.den for p in parts))
  np.testing.assert_allclose(float(merged.sum), float(out.loss.sum), rtol=1e-5, atol=1e-6)
  assert float(merged.den) == float(out.loss.den)


def test_value_clip_by_hand_and_its_gradient():
  """V_old = 0, c = 0.2, G = 1: v = 0.5 and v = 1.5 are clipped to 0.2, whose error
  (0.2 − 1)² = 0.64 beats their own 0.25: the loss is ½ · 0.64 with gradient 0 in v; v = 0.1
  lies inside the range: ½ · 0.9², gradient v − G = −0.9."""
  def loss(v):
    return value_loss(v, jnp.zeros((1, 3)), jnp.ones((1, 3)), jnp.ones((1, 3), bool),
                      cliprange_value=0.2).loss.sum
  v = jnp.array([[0.5, 1.5, 0.1]])
  np.testing.assert_allclose(float(loss(v)), 0.5 * (0.64 + 0.64 + 0.81), rtol=1e-6)
  np.testing.assert_allclose(jax.grad(loss)(v), [[0.0, 0.0, -0.9]], atol=1e-6)
  with pytest.raises(ValueError, match="cliprange_value"):
    value_loss(v, v, v, jnp.ones((1, 3), bool), cliprange_value=0.0)


@pytest.mark.parametrize("make, field", [
    (lambda: PPOOptions(gamma=1.5), "gamma"),
    (lambda: PPOOptions(lam=-0.1), "lam"),
    (lambda: PPOOptions(whiten=1), "whiten"),
    (lambda: PPOOptions(zscore=None), "zscore"),
    (lambda: TurnPPOOptions(shared_prefix="first"), "shared_prefix"),
])
def test_invalid_options_name_the_option(make, field):
  with pytest.raises(ValueError, match=field):
    make()


def test_turn_ppo_defaults_are_turn_ppos_and_jit_agrees():
  assert (TurnPPOOptions().gamma, TurnPPOOptions().lam) == (0.99, 0.9)
  assert (PPOOptions().gamma, PPOOptions().lam) == (1.0, 1.0)
  r = shared_tree()
  for name in NAMES:
    opts = advantages.get(name).options()
    np.testing.assert_allclose(advantages.get(name)(r).tokens, run(name, r, opts).tokens,
                               atol=1e-6)


def test_prefix_values_are_one_per_prefix():
  tokens = np.array([[1, 2, 3, 0], [1, 2, 4, 5]])
  valid = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)
  v = prefix_value_array(tokens, valid, seed=1)
  np.testing.assert_array_equal(v[0, :3], v[1, :3])  # the prefixes before tokens 0, 1, 2 agree
  assert v[0, 3] == 0 and v[1, 3] != v[0, 2]


def test_the_trainer_trains_them_and_the_beyond_grid_holds_them():
  """The trainer has a value model (`tirjax.train_steps.critic`): a run of ppo / turn_ppo
  resolves, with its critic's options; both are cells of grid=beyond. The credit bench has
  no value model, so it still leaves them out."""
  import importlib  # noqa: PLC0415
  from configs import ablate  # noqa: PLC0415
  from tirjax.credit import cells  # noqa: PLC0415
  from tirjax.trainer import resolve  # noqa: PLC0415
  for name in NAMES:
    c = importlib.import_module(f"configs.{name}").get_config("model=tiny")
    exp = resolve.resolve(c)
    assert exp.has_critic and exp.critic.aggregation == exp.loss.aggregation
    assert name in ablate.GRIDS["beyond"] and name in ablate.ESTIMATORS
    assert not any(label.split("/")[0] == name for label in cells.default_labels())
  grpo = resolve.resolve(importlib.import_module("configs.grpo").get_config("model=tiny"))
  assert not grpo.has_critic
