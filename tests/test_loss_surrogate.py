"""Clip branches of the surrogate, dual clip and the ±20 clamp, against the textbook formula."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tirjax.testing.reference import loss as ref
from tirjax import loss
from tirjax.loss import ratio as ratio_lib
from tirjax.loss import surrogate

EPS_LOW, EPS_HIGH, C = 0.2, 0.28, 3.0

# (A, ρ, dual clip on, branch, pg, dpg/dρ) — values written out by hand.
CASES = [
    # A > 0
    (1.5, 0.5, False, "unclipped (ρ < 1-ε_low)", -0.75, -1.5),
    (1.5, 1.1, False, "unclipped (inside)", -1.65, -1.5),
    (1.5, 1.5, False, "clipped high", -1.5 * 1.28, 0.0),
    (1.5, 5.0, True, "clipped high; dual clip ignores A > 0", -1.5 * 1.28, 0.0),
    # A < 0
    (-2.0, 0.5, False, "clipped low", 2.0 * 0.8, 0.0),
    (-2.0, 0.5, True, "clipped low, dual on", 2.0 * 0.8, 0.0),
    (-2.0, 1.1, False, "unclipped (inside)", 2.2, 2.0),
    (-2.0, 2.0, False, "unclipped (ρ > 1+ε_high)", 4.0, 2.0),
    (-2.0, 2.0, True, "unclipped (1+ε_high < ρ < c)", 4.0, 2.0),
    (-2.0, 5.0, False, "unclipped, no dual clip", 10.0, 2.0),
    (-2.0, 5.0, True, "dual clipped (ρ > c)", 6.0, 0.0),
    # A = 0
    (0.0, 1.5, True, "zero advantage", 0.0, 0.0),
    (0.0, 0.5, False, "zero advantage", 0.0, 0.0),
]


def _pg(rho, a, dual):
  out = surrogate.clipped_surrogate(rho, a, EPS_LOW, EPS_HIGH)
  return surrogate.dual_clip(out, a, C) if dual else out


@pytest.mark.parametrize("a,rho,dual,branch,want,want_grad", CASES,
                         ids=[f"A={c[0]},rho={c[1]},dual={c[2]}" for c in CASES])
def test_clip_branch_value_and_ratio_gradient(a, rho, dual, branch, want, want_grad):
  c = C if dual else None
  assert ref.pg(rho, a, EPS_LOW, EPS_HIGH, c) == pytest.approx(want, abs=1e-12), branch
  h = 1e-6  # central difference of the reference, in float64
  fd = (ref.pg(rho + h, a, EPS_LOW, EPS_HIGH, c) -
        ref.pg(rho - h, a, EPS_LOW, EPS_HIGH, c)) / (2 * h)
  assert fd == pytest.approx(want_grad, abs=1e-6), branch

  value, grad = jax.value_and_grad(lambda r: _pg(r, jnp.float32(a), dual))(jnp.float32(rho))
  assert float(value) == pytest.approx(want, rel=1e-6, abs=1e-6), branch
  assert float(grad) == pytest.approx(want_grad, abs=1e-6), branch


def test_clip_indicators_match_branches():
  a = jnp.array([c[0] for c in CASES], jnp.float32)
  rho = jnp.array([c[1] for c in CASES], jnp.float32)
  low = np.asarray(surrogate.clipped_low(rho, a, EPS_LOW))
  high = np.asarray(surrogate.clipped_high(rho, a, EPS_HIGH))
  dual = np.asarray(surrogate.clipped_dual(rho, a, C))
  for i, (_, _, dual_on, branch, _, _) in enumerate(CASES):
    assert low[i] == branch.startswith("clipped low"), branch
    assert high[i] == branch.startswith("clipped high"), branch
    assert (dual[i] and dual_on) == branch.startswith("dual clipped"), branch


@pytest.mark.parametrize("dual", [False, True])
def test_logp_gradient_through_policy_loss_all_branches(dual):
  """d loss / d logp_t = (dpg/dρ)·ρ, token by token, through the full loss (token_mean)."""
  cases = [c for c in CASES if c[2] == dual]
  a = np.array([c[0] for c in cases], np.float32)
  rho = np.array([c[1] for c in cases], np.float64)
  old = np.full(len(cases), -1.0, np.float32)
  logp = (old + np.log(rho)).astype(np.float32)
  mask = np.ones((1, len(cases)), bool)
  c = C if dual else None
  opts = loss.LossOptions(clip_low=EPS_LOW, clip_high=EPS_HIGH, dual_clip=c,
                          aggregation="token_mean")
  fn = lambda lp: loss.policy_loss(lp, old[None], a[None], mask, np.ones(1, bool), opts).loss.sum
  grad = np.asarray(jax.grad(fn)(jnp.asarray(logp[None])))[0]
  for i, (ai, ri, _, branch, _, want_grad) in enumerate(cases):
    h = 1e-6
    fd = (ref.pg(ri * math.exp(h), ai, EPS_LOW, EPS_HIGH, c) -
          ref.pg(ri * math.exp(-h), ai, EPS_LOW, EPS_HIGH, c)) / (2 * h)
    assert grad[i] == pytest.approx(fd, rel=1e-4, abs=1e-5), branch
    assert grad[i] == pytest.approx(want_grad * ri, rel=1e-4, abs=1e-5), branch


@pytest.mark.parametrize("diff,a", [(25.0, -1.0), (-25.0, 1.0), (25.0, 1.0), (-25.0, -1.0)])
def test_log_ratio_clamp_bounds_value_and_kills_gradient(diff, a):
  old = jnp.float32(-3.0)
  logp = old + jnp.float32(diff)
  rho = ratio_lib.token_ratio(logp, old)
  assert float(rho) == pytest.approx(math.exp(math.copysign(20.0, diff)), rel=1e-5)
  assert float(rho) == pytest.approx(ref.ratio(float(logp), float(old)), rel=1e-5)
  f = lambda lp: surrogate.clipped_surrogate(ratio_lib.token_ratio(lp, old), jnp.float32(a),
                                             EPS_LOW, EPS_HIGH)
  value, grad = jax.value_and_grad(f)(logp)
  want = ref.pg(ref.ratio(float(logp), float(old)), a, EPS_LOW, EPS_HIGH)
  assert float(value) == pytest.approx(want, rel=1e-5)
  assert np.isfinite(float(value)) and float(grad) == 0.0


def test_inside_clamp_gradient_is_ratio():
  old = jnp.float32(-3.0)
  grad = jax.grad(lambda lp: ratio_lib.token_ratio(lp, old))(old + 19.0)
  assert float(grad) == pytest.approx(math.exp(19.0), rel=1e-5)
