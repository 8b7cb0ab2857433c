"""KL estimators, GSPO ratio, options, diagnostics and the composed loss against the reference."""

import math

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, strategies as st

from tirjax.testing.reference import loss as ref
from tirjax import advantages, loss
from tirjax.loss import kl, ratio as ratio_lib
from tirjax.testing.records import GroupRecord, RowRecord, StepRecord, build_rollouts

PAIRS = [(-1.0, -1.0), (-0.5, -2.0), (-3.0, -0.2), (-0.01, -30.0), (-30.0, -0.01), (-2.5, -2.4)]


@pytest.mark.parametrize("estimator", kl.ESTIMATORS)
def test_kl_estimators_match_formulas(estimator):
  logp = jnp.array([p for p, _ in PAIRS], jnp.float32)
  ref_lp = jnp.array([r for _, r in PAIRS], jnp.float32)
  got = np.asarray(kl.kl_penalty(logp, ref_lp, estimator))
  hand = {  # Schulman 2020 with log r = ref − logp, written out per estimator
      "k1": [p - r for p, r in PAIRS],
      "k2": [0.5 * (p - r) ** 2 for p, r in PAIRS],
      "k3": [min(10.0, math.exp(max(-20, min(20, r - p))) - max(-20, min(20, r - p)) - 1)
             for p, r in PAIRS],
  }[estimator]
  np.testing.assert_allclose(got, hand, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got, [ref.kl(p, r, estimator) for p, r in PAIRS], rtol=1e-5,
                             atol=1e-6)
  assert np.all(np.isfinite(got))
  if estimator != "k1":
    assert np.all(got >= 0) and got[0] == 0.0


def test_kl_estimator_gradients():
  """∇_logp: k1 → 1, k2 → logp − ref, k3 → 1 − exp(ref − logp)."""
  logp, r = jnp.float32(-1.3), jnp.float32(-0.7)
  for est, want in (("k1", 1.0), ("k2", -0.6), ("k3", 1 - math.exp(0.6))):
    g = jax.grad(lambda lp: kl.kl_penalty(lp, r, est))(logp)
    assert float(g) == pytest.approx(want, rel=1e-5), est


@pytest.mark.parametrize("clamp, value, grad", [
    (10.0, 10.0, 0.0),  # verl's low_var_kl: clamped, no gradient
    (0.0, math.exp(3) - 4, 1 - math.exp(3)),  # off: 16.09 with gradient -19.09
    (20.0, math.exp(3) - 4, 1 - math.exp(3))])  # a looser clamp leaves it alone
def test_k3_value_clamp_for_a_reference_3_nats_away(clamp, value, grad):
  logp, r = jnp.float32(-4.0), jnp.float32(-1.0)  # ref − logp = 3
  got, g = jax.value_and_grad(lambda lp: kl.kl_penalty(lp, r, "k3", clamp))(logp)
  assert float(got) == pytest.approx(value, rel=1e-5)
  assert float(g) == pytest.approx(grad, rel=1e-5, abs=1e-7)
  assert ref.kl(-4.0, -1.0, "k3", clamp) == pytest.approx(value, rel=1e-9)


def test_k3_clamp_reaches_the_composed_loss():
  """A token whose reference is far away adds β·10 to the loss and nothing to its gradient."""
  logp = jnp.array([[-4.0, -1.0]], jnp.float32)
  ref_lp = jnp.array([[-1.0, -1.0]], jnp.float32)
  zeros = jnp.zeros_like(logp)
  mask, rows = jnp.ones_like(logp, bool), jnp.ones((1,), bool)

  def total(lp, clamp):
    opts = loss.LossOptions(kl_coef=1.0, kl_estimator="k3", kl_clamp=clamp,
                            aggregation="token_mean")
    out = loss.policy_loss(lp, lp, zeros, mask, rows, opts, ref_logprobs=ref_lp)
    return out.loss.sum / out.loss.den

  value, g = jax.value_and_grad(total)(logp, 10.0)
  assert float(value) == pytest.approx(10.0 / 2, rel=1e-5)
  np.testing.assert_allclose(np.asarray(g), [[0.0, 0.0]], atol=1e-7)
  value_off = total(logp, 0.0)
  assert float(value_off) == pytest.approx((math.exp(3) - 4) / 2, rel=1e-5)


def test_kl_rejects_unknown_estimator():
  with pytest.raises(ValueError, match="kl_estimator"):
    kl.kl_penalty(jnp.zeros(2), jnp.zeros(2), "k4")


def _gspo_batch():
  rng = np.random.default_rng(5)
  B, L = 4, 7
  old = rng.uniform(-3, -0.2, (B, L)).astype(np.float32)
  logp = (old + rng.normal(0, 0.3, (B, L))).astype(np.float32)
  mask = np.arange(L)[None, :] < np.array([7, 3, 0, 5])[:, None]
  row_adv = np.array([1.2, -0.8, 0.5, -2.0], np.float32)
  return logp, old, mask, row_adv


def test_gspo_sequence_ratio_matches_reference():
  logp, old, mask, _ = _gspo_batch()
  got = np.exp(np.asarray(ratio_lib.sequence_log_ratio(logp, old, mask)))
  want = [ref.seq_ratio(logp[b].tolist(), old[b].tolist(), mask[b].tolist()) for b in range(4)]
  np.testing.assert_allclose(got, want, rtol=1e-6)
  tok = np.asarray(ratio_lib.gspo_token_ratio(logp, old, mask))
  for b in range(4):
    np.testing.assert_allclose(tok[b][mask[b]], want[b], rtol=1e-6)


def test_gspo_token_equals_sequence_level_gspo_in_value_and_gradient():
  """GSPO-token with row-constant A and seq_mean_token_mean is sequence-level GSPO:
  J = (1/G) Σ_i min(s_i A_i, clip(s_i) A_i), differentiated by finite differences in float64."""
  logp, old, mask, row_adv = _gspo_batch()
  adv = np.where(mask, row_adv[:, None], 0.0).astype(np.float32)
  eps_low, eps_high = 0.1, 0.15  # small bounds so that some rows clip
  opts = loss.LossOptions(clip_low=eps_low, clip_high=eps_high, ratio_level="sequence",
                          aggregation="seq_mean_token_mean")
  rows = np.ones(4, bool)

  def seq_loss(lp):
    live = [b for b in range(4) if mask[b].any()]
    total = 0.0
    for b in live:
      s = ref.seq_ratio(lp[b].tolist(), old[b].tolist(), mask[b].tolist())
      total += ref.pg(s, float(row_adv[b]), eps_low, eps_high)
    return total / len(live)

  lp64 = logp.astype(np.float64)
  fn = lambda lp: loss.policy_loss(lp, old, adv, mask, rows, opts).loss.value
  value, grad = jax.value_and_grad(fn)(jnp.asarray(logp))
  assert float(value) == pytest.approx(seq_loss(lp64), rel=1e-5)
  fd = np.zeros_like(lp64)
  for b, t in zip(*np.nonzero(mask)):
    e = np.zeros_like(lp64)
    e[b, t] = 1e-6
    fd[b, t] = (seq_loss(lp64 + e) - seq_loss(lp64 - e)) / 2e-6
  np.testing.assert_allclose(np.asarray(grad), fd, rtol=1e-4, atol=1e-6)
  s = [ref.seq_ratio(lp64[b].tolist(), old[b].tolist(), mask[b].tolist()) for b in range(4)]
  clipped = [b for b in range(4) if mask[b].any() and
             (row_adv[b] > 0 and s[b] > 1 + eps_high or row_adv[b] < 0 and s[b] < 1 - eps_low)]
  unclipped = [b for b in range(4) if mask[b].any() and b not in clipped]
  assert clipped and unclipped, (s, row_adv)  # the fixture exercises both branches


BAD_OPTIONS = [
    ("clip_low", dict(clip_low=1.0)), ("clip_low", dict(clip_low=-0.1)),
    ("clip_high", dict(clip_high=-0.2)), ("clip_high", dict(clip_high=float("inf"))),
    ("dual_clip", dict(dual_clip=1.0)), ("dual_clip", dict(dual_clip=0.5)),
    ("ratio_level", dict(ratio_level="row")), ("kl_coef", dict(kl_coef=-1e-3)),
    ("kl_coef", dict(kl_coef=float("nan"))), ("kl_estimator", dict(kl_estimator="k4")),
    ("kl_clamp", dict(kl_clamp=-1.0)),
    ("entropy_coef", dict(entropy_coef=-0.1)), ("aggregation", dict(aggregation="mean")),
    ("norm_constant", dict(aggregation="seq_mean_token_sum_norm")),
    ("norm_constant", dict(norm_constant=0.0)), ("clip_low", dict(clip_low="0.2")),
]


@pytest.mark.parametrize("name,kwargs", BAD_OPTIONS)
def test_options_reject_bad_values_by_name(name, kwargs):
  with pytest.raises(ValueError, match=name):
    loss.LossOptions(**kwargs)


def test_missing_inputs_are_named():
  z = jnp.zeros((2, 3))
  m = jnp.ones((2, 3), bool)
  with pytest.raises(ValueError, match="ref_logprobs"):
    loss.policy_loss(z, z, z, m, jnp.ones(2, bool), loss.LossOptions(kl_coef=0.1))
  with pytest.raises(ValueError, match="entropy"):
    loss.policy_loss(z, z, z, m, jnp.ones(2, bool), loss.LossOptions(entropy_coef=0.1))
  with pytest.raises(AssertionError):
    loss.policy_loss(z, z[:, :2], z, m, jnp.ones(2, bool))


# Property test against the reference: one fixed shape and a handful of option sets, so the
# jitted loss compiles a few times only.
B, L = 4, 5
OPTION_SETS = [
    dict(eps_low=0.2, eps_high=0.2, c=None, sequence=False, beta=0.0, estimator="k3",
         ent_coef=0.0, mode="token_mean", norm=None),
    dict(eps_low=0.2, eps_high=0.28, c=3.0, sequence=False, beta=0.001, estimator="k3",
         ent_coef=0.001, mode="seq_mean_token_mean", norm=None),
    dict(eps_low=0.1, eps_high=0.3, c=2.0, sequence=False, beta=0.5, estimator="k1",
         ent_coef=0.0, mode="seq_mean_token_sum_norm", norm=8.0),
    dict(eps_low=0.2, eps_high=0.2, c=None, sequence=True, beta=0.2, estimator="k2",
         ent_coef=0.05, mode="seq_mean_token_sum", norm=None),
    dict(eps_low=0.05, eps_high=0.05, c=3.0, sequence=True, beta=0.0, estimator="k3",
         ent_coef=0.0, mode="seq_mean_token_mean", norm=None),
    dict(eps_low=0.2, eps_high=0.2, c=None, sequence=False, beta=0.3, estimator="k3",
         ent_coef=0.0, mode="token_mean", norm=None, clamp=0.0),  # k3 without its value clamp
]


def _options(o):
  return loss.LossOptions(clip_low=o["eps_low"], clip_high=o["eps_high"], dual_clip=o["c"],
                          ratio_level="sequence" if o["sequence"] else "token", kl_coef=o["beta"],
                          kl_estimator=o["estimator"], entropy_coef=o["ent_coef"],
                          kl_clamp=o.get("clamp", 10.0), aggregation=o["mode"],
                          norm_constant=o["norm"])


_jit_loss = jax.jit(loss.policy_loss, static_argnames="opts")
_floats = lambda lo, hi: hnp.arrays(np.float32, (B, L), elements=st.floats(
    lo, hi, width=32, allow_nan=False))


@given(option=st.integers(0, len(OPTION_SETS) - 1), old=_floats(-8, 0),
       diff=hnp.arrays(np.float32, (B, L), elements=st.one_of(
           st.floats(-1, 1, width=32), st.sampled_from([-25.0, -3.0, 0.0, 3.0, 25.0]))),
       adv=hnp.arrays(np.float32, (B, L), elements=st.one_of(
           st.floats(-3, 3, width=32), st.just(0.0))),
       ref_diff=hnp.arrays(np.float32, (B, L), elements=st.one_of(
           st.floats(-2, 2, width=32), st.sampled_from([-12.0, -3.0, 3.0, 12.0]))),
       ent=_floats(0, 5),
       lengths=hnp.arrays(np.int32, (B,), elements=st.integers(0, L)),
       row_mask=hnp.arrays(bool, (B,)))
def test_loss_and_diagnostics_match_reference(option, old, diff, adv, ref_diff, ent, lengths,
                                              row_mask):
  o = OPTION_SETS[option]
  logp = (old + diff).astype(np.float32)
  ref_lp = (logp + ref_diff).astype(np.float32)
  mask = np.arange(L)[None, :] < lengths[:, None]
  out = _jit_loss(logp, old, adv, mask, row_mask, opts=_options(o), ref_logprobs=ref_lp,
                  entropy=ent)
  args = [x.astype(np.float64).tolist() for x in (logp, old, adv)] + [mask.tolist(),
                                                                     row_mask.tolist()]
  want = ref.policy_loss(*args, ref=ref_lp.astype(np.float64).tolist(),
                         entropy=ent.astype(np.float64).tolist(), **o)
  for term in ("loss", "pg", "kl", "entropy"):
    got = float(getattr(out, term).value)
    assert np.isfinite(got)
    assert got == pytest.approx(want[term], rel=2e-5, abs=2e-5), term
  got_diag = loss.finalize(out.metrics)
  want_diag = ref.diagnostics(*args, eps_low=o["eps_low"], eps_high=o["eps_high"], c=o["c"],
                              sequence=o["sequence"])
  assert got_diag.keys() == want_diag.keys() | {"entropy/" + k for k in
                                                ("mean", "std", "min", "max", "count")}
  for k, w in want_diag.items():
    # std comes from the sum of squares in float32: its error grows like sqrt(eps)·max|x|.
    tol = 2e-3 * max(1.0, abs(want_diag[k[:-4] + "/max"])) if k.endswith("/std") else 2e-5
    assert float(got_diag[k]) == pytest.approx(w, rel=2e-5, abs=tol), k


def test_rollouts_loss_reads_the_batch_and_the_estimator():
  groups = [GroupRecord(rows=[
      RowRecord(outcome=1, steps=[StepRecord(tokens=(5, 6, 7), logprobs=(-0.5, -1.0, -0.2))]),
      RowRecord(outcome=-1, steps=[StepRecord(tokens=(8, 9), logprobs=(-2.0, -0.1)),
                                   StepRecord(tokens=(4,), logprobs=(-0.3,))]),
  ])]
  r = build_rollouts(groups, max_tokens=6, with_ref=True)
  adv = advantages.get("grpo")(r)
  logp = r.old_logprobs + 0.1 * r.loss_mask
  opts = loss.LossOptions(kl_coef=0.01)
  got = loss.rollouts_loss(logp, r, adv, opts)
  want = loss.policy_loss(logp, r.old_logprobs, adv.tokens, r.loss_mask, adv.row_mask, opts,
                          ref_logprobs=r.ref_logprobs)
  assert float(got.loss.value) == float(want.loss.value)
  # GRPO gives A = ±1/√2 (ddof 1); ρ = e^0.1 lies inside [0.8, 1.2], so both rows are unclipped.
  row_adv = np.asarray(adv.rows)
  rho = math.exp(0.1)
  want_pg = (-(rho * row_adv[0]) - rho * row_adv[1]) / 2
  assert float(got.pg.value) == pytest.approx(want_pg, rel=1e-5)
