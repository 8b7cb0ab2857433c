"""CISPO (spec §4.4, MiniMax-M1): the clipped, stop-gradiented importance weight times
A · log π, on both signs of A, against the textbook formula and its gradient."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tirjax import loss
from tirjax.loss import surrogate
from tirjax.testing.reference import loss as ref

EPS_LOW, EPS_HIGH = 0.2, 0.28

# (A, ρ, weight clip(ρ) written out by hand, what the clipped surrogate does there)
CASES = [
    (1.5, 0.5, 0.8, "A > 0, ρ < 1 − ε_low: weight raised to 0.8; PPO unclipped"),
    (1.5, 1.0, 1.0, "A > 0, ρ = 1: the same gradient as PPO"),
    (1.5, 1.1, 1.1, "A > 0, inside"),
    (1.5, 1.5, 1.28, "A > 0, ρ > 1 + ε_high: PPO drops the token, CISPO keeps it at 1.28"),
    (-2.0, 0.5, 0.8, "A < 0, ρ < 1 − ε_low: PPO drops the token, CISPO keeps it at 0.8"),
    (-2.0, 1.0, 1.0, "A < 0, ρ = 1"),
    (-2.0, 1.1, 1.1, "A < 0, inside"),
    (-2.0, 5.0, 1.28, "A < 0, ρ > 1 + ε_high: weight capped at 1.28; PPO unclipped (5)"),
    (0.0, 1.5, 1.28, "A = 0: no gradient"),
]
LOGP = -1.7  # log π of the token under the current policy


@pytest.mark.parametrize("a,rho,weight,branch", CASES, ids=[c[3] for c in CASES])
def test_value_and_gradient_against_the_textbook_formula(a, rho, weight, branch):
  want = -weight * a * LOGP
  assert ref.cispo_pg(rho, a, LOGP, EPS_LOW, EPS_HIGH) == pytest.approx(want, abs=1e-12)
  assert ref.cispo_grad(rho, a, EPS_LOW, EPS_HIGH) == pytest.approx(-weight * a, abs=1e-12)

  # ρ moves with log π (old fixed): the stop-gradient must keep the weight out of the gradient.
  old = LOGP - math.log(rho)

  def pg(lp):
    ratio = jnp.exp(lp - old)
    return surrogate.cispo_surrogate(ratio, jnp.float32(a), lp, EPS_LOW, EPS_HIGH)

  value, grad = jax.value_and_grad(pg)(jnp.float32(LOGP))
  assert float(value) == pytest.approx(want, rel=1e-5, abs=1e-6), branch
  assert float(grad) == pytest.approx(-weight * a, rel=1e-5, abs=1e-6), branch


@pytest.mark.parametrize("a,rho,weight,branch", CASES, ids=[c[3] for c in CASES])
def test_no_token_gradient_is_dropped_where_the_surrogate_drops_it(a, rho, weight, branch):
  """d pg / d log π: CISPO −clip(ρ)·A everywhere; PPO's clipped branch gives 0."""
  old = LOGP - math.log(rho)
  ppo = jax.grad(lambda lp: surrogate.clipped_surrogate(jnp.exp(lp - old), jnp.float32(a),
                                                        EPS_LOW, EPS_HIGH))(jnp.float32(LOGP))
  cispo = jax.grad(lambda lp: surrogate.cispo_surrogate(jnp.exp(lp - old), jnp.float32(a), lp,
                                                        EPS_LOW, EPS_HIGH))(jnp.float32(LOGP))
  clipped = (a > 0 and rho > 1 + EPS_HIGH) or (a < 0 and rho < 1 - EPS_LOW)
  if clipped:
    assert float(ppo) == 0.0 and float(cispo) != 0.0, branch
  elif rho == 1.0:
    assert float(cispo) == pytest.approx(float(ppo), rel=1e-6), branch  # −A·ρ·∇logπ at ρ = 1


def test_composed_loss_matches_the_reference_with_ratios_away_from_one():
  """The full loss (token mean) with ρ ≠ 1 fed directly, both signs of A, against the loop
  reference's value and its per-token gradient −clip(ρ)·A / n."""
  rho = np.array([0.5, 0.9, 1.0, 1.2, 1.6, 3.0, 0.7, 1.4])
  adv = np.array([1.5, -2.0, 0.7, -0.3, 2.0, -1.0, -1.2, 0.4], np.float32)
  logp = np.array([-0.3, -1.0, -2.2, -0.1, -4.0, -0.6, -1.5, -0.9], np.float32)
  old = (logp - np.log(rho)).astype(np.float32)
  mask = np.array([[True] * 7 + [False]])
  opts = loss.LossOptions(clip_low=EPS_LOW, clip_high=EPS_HIGH, surrogate="cispo",
                          aggregation="token_mean")

  def total(lp):
    out = loss.policy_loss(lp, old[None], adv[None], mask, np.ones(1, bool), opts)
    return out.loss.sum / out.loss.den

  value, grad = jax.value_and_grad(total)(jnp.asarray(logp[None]))
  true_rho = np.exp(logp.astype(np.float64) - old)
  want = ref.policy_loss([logp.tolist()], [old.tolist()], [adv.tolist()], mask.tolist(), [True],
                         eps_low=EPS_LOW, eps_high=EPS_HIGH, surrogate="cispo")["loss"]
  assert float(value) == pytest.approx(want, rel=1e-5)
  want_grad = [ref.cispo_grad(true_rho[i], float(adv[i]), EPS_LOW, EPS_HIGH) / 7
               if mask[0, i] else 0.0 for i in range(8)]
  np.testing.assert_allclose(np.asarray(grad)[0], want_grad, rtol=1e-5, atol=1e-7)


def test_single_update_gradient_equals_the_clipped_surrogate():
  """ρ = 1 (the first update on a batch): CISPO and the clipped surrogate give one gradient."""
  rng = np.random.default_rng(0)
  logp = -rng.exponential(1.0, (3, 6)).astype(np.float32)
  adv = rng.normal(size=(3, 6)).astype(np.float32)
  mask = rng.random((3, 6)) < 0.8

  def grad(surrogate_name):
    opts = loss.LossOptions(surrogate=surrogate_name)
    fn = lambda lp: loss.policy_loss(lp, logp, adv, mask, np.ones(3, bool), opts).loss.sum
    return np.asarray(jax.grad(fn)(jnp.asarray(logp)))

  np.testing.assert_allclose(grad("cispo"), grad("clip"), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kwargs, field", [
    (dict(surrogate="cispo", dual_clip=3.0), "dual_clip"),
    (dict(surrogate="reinforce"), "surrogate"),
    (dict(surrogate="clip", clip_low=1.0), "clip_low"),
    (dict(surrogate="cispo", clip_low=-0.1), "clip_low"),
])
def test_invalid_options_name_the_option(kwargs, field):
  with pytest.raises(ValueError, match=field):
    loss.LossOptions(**kwargs)


def test_cispo_accepts_no_lower_bound():
  """MiniMax-M1 (and verl's example, ε_low = 10) leave the weight without a lower bound."""
  opts = loss.LossOptions(surrogate="cispo", clip_low=10.0)
  old = jnp.array([[0.0]])
  lp = jnp.array([[-3.0]])  # ρ = e^-3 ≈ 0.05, kept as is
  g = jax.grad(lambda x: loss.policy_loss(x, old, jnp.array([[1.0]]), jnp.ones((1, 1), bool),
                                          jnp.ones(1, bool), opts).loss.sum)(lp)
  assert float(g[0, 0]) == pytest.approx(-math.exp(-3.0), rel=1e-5)
