"""Aggregation modes as (sum, den); exact accumulation over micro-batches; empty batches."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tirjax.testing.reference import loss as ref
from tirjax import loss
from tirjax.loss import aggregation

X = np.array([[1, 2, 3, 4], [10, 20, 0, 0], [5, 0, 0, 0]], np.float32)
M = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]], bool)  # row 2 carries no token

# Row 0: tokens 1, 2, 3 (sum 6, n 3); row 1: 10, 20 (sum 30, n 2); row 2: none.
HAND = {
    "token_mean": (36.0, 5.0, 7.2),  # (1+2+3+10+20) / 5
    "seq_mean_token_mean": (17.0, 2.0, 8.5),  # (6/3 + 30/2) / 2
    "seq_mean_token_sum_norm": (9.0, 2.0, 4.5),  # (6/4 + 30/4) / 2, C = 4
    "seq_mean_token_sum": (36.0, 2.0, 18.0),  # (6 + 30) / 2
}


@pytest.mark.parametrize("mode", aggregation.AGGREGATIONS)
def test_aggregation_hand_computed(mode):
  want_sum, want_den, want_value = HAND[mode]
  out = aggregation.aggregate(jnp.asarray(X), jnp.asarray(M), mode, norm_constant=4.0)
  assert float(out.sum) == pytest.approx(want_sum)
  assert float(out.den) == pytest.approx(want_den)
  assert float(out.value) == pytest.approx(want_value)
  assert ref.aggregate(X.tolist(), M.tolist(), mode, 4.0) == pytest.approx(want_value)


def test_aggregate_rejects_bad_mode_and_missing_constant():
  with pytest.raises(ValueError, match="aggregation"):
    aggregation.aggregate(jnp.asarray(X), jnp.asarray(M), "token_sum")
  with pytest.raises(ValueError, match="norm_constant"):
    aggregation.aggregate(jnp.asarray(X), jnp.asarray(M), "seq_mean_token_sum_norm")


def _batch(seed, B=8, L=6):
  rng = np.random.default_rng(seed)
  old = rng.uniform(-4, -0.1, (B, L)).astype(np.float32)
  logp = (old + rng.normal(0, 0.4, (B, L))).astype(np.float32)
  adv = rng.choice([-1.5, -0.3, 0.0, 0.4, 2.0], (B, L)).astype(np.float32)
  lengths = rng.integers(0, L + 1, B)
  lengths[1] = 0  # one row without generated tokens
  mask = np.arange(L)[None, :] < lengths[:, None]
  row_mask = rng.random(B) > 0.2
  ref_lp = (old + rng.normal(0, 0.3, (B, L))).astype(np.float32)
  ent = rng.uniform(0, 3, (B, L)).astype(np.float32)
  return dict(logprobs=logp, old_logprobs=old, advantages=adv, loss_mask=mask,
              row_mask=row_mask), dict(ref_logprobs=ref_lp, entropy=ent)


def _opts(mode):
  return loss.LossOptions(clip_low=0.2, clip_high=0.28, dual_clip=3.0, kl_coef=0.05,
                          entropy_coef=0.01, aggregation=mode, norm_constant=6.0)


_loss = jax.jit(loss.policy_loss, static_argnames="opts")


def _loss_sum(logprobs, rest, opts):
  out = loss.policy_loss(logprobs, **rest, opts=opts)
  return out.loss.sum, out


_sum_and_grad = jax.jit(jax.value_and_grad(_loss_sum, has_aux=True), static_argnames="opts")
_value_grad = jax.jit(jax.grad(lambda lp, rest, opts: loss.policy_loss(lp, **rest, opts=opts)
                               .loss.value), static_argnames="opts")


@pytest.mark.parametrize("mode", aggregation.AGGREGATIONS)
def test_micro_batch_accumulation_is_exact(mode):
  """Σ sums / Σ dens over 1, 2, 4 row-splits = the full-batch value of the reference, in loss
  terms, diagnostics and gradient (Σ ∇sums / Σ dens = ∇ of the full-batch loss)."""
  pos, kw = _batch(0)
  lp = pos["logprobs"]
  rest = {k: v for k, v in {**pos, **kw}.items() if k != "logprobs"}
  hyper = dict(eps_low=0.2, eps_high=0.28, c=3.0, beta=0.05, estimator="k3", ent_coef=0.01,
               mode=mode, norm=6.0)
  host = {k: v.astype(np.float64).tolist() if v.dtype == np.float32 else v.tolist()
          for k, v in rest.items()}

  def reference(logprobs, term="loss"):
    return ref.policy_loss(logprobs.tolist(), host["old_logprobs"], host["advantages"],
                           host["loss_mask"], host["row_mask"], ref=host["ref_logprobs"],
                           entropy=host["entropy"], **hyper)[term]

  lp64 = lp.astype(np.float64)
  ref_grad = np.zeros_like(lp64)
  for b, t in np.ndindex(lp.shape):
    e = np.zeros_like(lp64)
    e[b, t] = 1e-6
    ref_grad[b, t] = (reference(lp64 + e) - reference(lp64 - e)) / 2e-6
  ref_diag = ref.diagnostics(lp64.tolist(), host["old_logprobs"], host["advantages"],
                             host["loss_mask"], host["row_mask"], eps_low=0.2, eps_high=0.28,
                             c=3.0)

  opts = _opts(mode)
  for parts in (1, 2, 4):
    acc, grads = None, []
    for idx in np.split(np.arange(8), parts):
      (_, out), grad = _sum_and_grad(lp[idx], {k: v[idx] for k, v in rest.items()}, opts=opts)
      acc = out if acc is None else loss.accumulate(acc, out)
      grads.append(grad)
    for term in ("loss", "pg", "kl", "entropy"):
      assert float(getattr(acc, term).value) == pytest.approx(reference(lp64, term), rel=1e-6,
                                                              abs=1e-7), (term, parts)
    np.testing.assert_allclose(np.concatenate(grads) / float(acc.loss.den), ref_grad,
                               rtol=1e-4, atol=1e-6)
    got_diag = loss.finalize(acc.metrics)
    for k, want in ref_diag.items():
      assert float(got_diag[k]) == pytest.approx(want, rel=1e-5, abs=1e-5), (k, parts)


@pytest.mark.parametrize("mode", aggregation.AGGREGATIONS)
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_all_masked_batch_is_zero_and_finite(mode, level):
  pos, kw = _batch(1)
  pos["row_mask"] = np.zeros(8, bool)
  opts = loss.LossOptions(dual_clip=3.0, kl_coef=0.1, entropy_coef=0.01, aggregation=mode,
                          norm_constant=6.0, ratio_level=level)
  rest = {k: v for k, v in {**pos, **kw}.items() if k != "logprobs"}
  (_, out), grad_sum = _sum_and_grad(pos["logprobs"], rest, opts=opts)
  values = loss.finalize(out)
  assert all(np.isfinite(float(v)) for v in values.values())
  assert all(float(v) == 0.0 for v in values.values())
  assert float(out.loss.den) == 0.0
  grad_value = _value_grad(pos["logprobs"], rest, opts=opts)
  assert np.all(np.asarray(grad_sum) == 0.0) and np.all(np.asarray(grad_value) == 0.0)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_garbage_outside_mask_never_leaks(level):
  """NaN / Inf on masked tokens give the same loss and gradient as zeros there."""
  pos, kw = _batch(2)
  opts = loss.LossOptions(dual_clip=3.0, kl_coef=0.1, entropy_coef=0.01, ratio_level=level)
  outside = ~(pos["loss_mask"] & pos["row_mask"][:, None])
  values = {k: v for k, v in {**pos, **kw}.items() if k not in ("loss_mask", "row_mask")}
  dirty = {k: np.where(outside, [np.nan, np.inf, -np.inf][i % 3], v).astype(np.float32)
           for i, (k, v) in enumerate(values.items())}
  masks = dict(loss_mask=pos["loss_mask"], row_mask=pos["row_mask"])

  def run(d):
    rest = {**masks, **{k: v for k, v in d.items() if k != "logprobs"}}
    (value, _), grad = _sum_and_grad(d["logprobs"], rest, opts=opts)
    return value, grad

  clean = {k: np.where(outside, 0.0, v).astype(np.float32) for k, v in dirty.items()}
  (v_dirty, g_dirty), (v_clean, g_clean) = run(dirty), run(clean)
  assert np.isfinite(float(v_dirty)) and np.all(np.isfinite(np.asarray(g_dirty)))
  assert float(v_dirty) == float(v_clean)
  np.testing.assert_array_equal(np.asarray(g_dirty), np.asarray(g_clean))
  assert np.all(np.asarray(g_dirty)[outside] == 0.0)


def test_row_mask_equals_dropping_rows():
  pos, kw = _batch(3)
  opts = _opts("seq_mean_token_mean")
  keep = pos["row_mask"]
  out = _loss(**pos, **kw, opts=opts)
  sub = {k: v[keep] for k, v in {**pos, **kw}.items()}
  sub["row_mask"] = np.ones(int(keep.sum()), bool)
  dropped = _loss(**sub, opts=opts)
  for term in ("loss", "pg", "kl", "entropy"):
    assert float(getattr(out, term).value) == pytest.approx(float(getattr(dropped, term).value),
                                                            rel=1e-6)
