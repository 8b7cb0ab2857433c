"""TIS and MIS (`tirjax.loss.rollout_correction`, issue 54 item 2): the kernels against their
loop reference, their properties, their place in the policy loss, the options and config, the
trainer end to end (weights exactly 1 when the sampler's log-probs are the trainer's own), and
the gradient a perturbed sampler gives, corrected and not, against the on-policy one."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tirjax import advantages, loss, train_steps
from tirjax.config import config_from_dataclass, dataclass_from_config
from tirjax.loss import rollout_correction as rc
from tirjax.loss.rollout_correction import RolloutCorrectionOptions as RC
from tirjax.testing import offpolicy_gradients as og
from tirjax.testing import train_setup as ts
from tirjax.testing.reference import rollout_correction as ref
from tirjax.trainer import rl_metrics, stages

B, L = 6, 8

OPTION_SETS = st.builds(
    RC, is_level=st.sampled_from(["off", "token", "sequence"]),
    is_threshold=st.sampled_from([1.0, 1.5, 2.0, 5.0]),
    mask_level=st.sampled_from(["off", "sequence", "geometric"]),
    mask_low=st.sampled_from([0.2, 0.5, 0.9, 1.0]), mask_high=st.sampled_from([1.0, 1.2, 2.0, 8.0]))


def batch(seed, gap):
  """old and sampler log-probs [B, L] whose difference has scale `gap`; a ragged mask with a
  row of no loss token; NaN and ±inf off the mask (they must reach nothing)."""
  rng = np.random.default_rng(seed)
  old = rng.normal(-2.0, 1.0, (B, L)).astype(np.float32)
  sampler = (old + rng.normal(0.0, gap, (B, L))).astype(np.float32)
  mask = rng.random((B, L)) < 0.7
  mask[0] = False
  sampler[~mask] = rng.choice([np.nan, np.inf, -np.inf, 3.0], size=(~mask).sum())
  return old, sampler, mask


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), gap=st.sampled_from([0.0, 0.01, 0.3, 2.0, 40.0]),
       opts=OPTION_SETS)
def test_correction_matches_the_loop_reference(seed, gap, opts):
  old, sampler, mask = batch(seed, gap)
  got = rc.correction(jnp.asarray(old), jnp.asarray(sampler), jnp.asarray(mask), opts)
  want = ref.correction(old.tolist(), sampler.tolist(), mask.tolist(), is_level=opts.is_level,
                        threshold=opts.is_threshold, mask_level=opts.mask_level,
                        low=opts.mask_low, high=opts.mask_high)
  np.testing.assert_allclose(got.weights, want["weights"], rtol=2e-5, atol=1e-6)
  np.testing.assert_allclose(got.seq_log_ratio, want["seq_log_ratio"], rtol=1e-5, atol=1e-4)
  # a row's ratio on a bound can fall either side by rounding; elsewhere the rows agree
  seq = np.asarray(want["seq_log_ratio"])
  n = np.maximum(mask.sum(axis=1), 1)
  r = seq if opts.mask_level != "geometric" else seq / n
  near = np.minimum(abs(r - math.log(opts.mask_low)), abs(r - math.log(opts.mask_high))) < 1e-4
  np.testing.assert_array_equal(np.asarray(got.keep)[~near], np.asarray(want["keep"])[~near])
  assert np.all(np.isfinite(got.weights)) and np.all(np.asarray(got.weights)[~mask] == 0)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), opts=OPTION_SETS)
def test_identical_logprobs_give_weights_exactly_one(seed, opts):
  old, _, mask = batch(seed, 0.0)
  c = rc.correction(old, old, mask, opts)
  w = np.asarray(c.weights)
  assert np.all(w[mask] == 1.0) and np.all(w[~mask] == 0.0)
  assert np.all(np.asarray(c.keep)) and not np.any(np.asarray(c.truncated))
  m = {k: float(v) for k, v in rc.metrics(old, old, mask, opts).items()}
  assert m["gap_max"] == m["gap_q99"] == m["log_ratio_mean"] == 0.0
  assert m["masked_row_share"] == m["masked_token_share"] == 0.0


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), gap=st.sampled_from([0.1, 1.0, 30.0]),
       level=st.sampled_from(["token", "sequence"]), c=st.sampled_from([1.0, 2.0, 10.0]))
def test_weights_lie_in_0_c_and_a_sequence_weight_is_its_rows(seed, gap, level, c):
  old, sampler, mask = batch(seed, gap)
  got = rc.correction(old, sampler, mask, RC(is_level=level, is_threshold=c))
  w, tr = np.asarray(got.weights), np.asarray(got.truncated)
  assert np.all(w[mask] > 0) and np.all(w[mask] <= c) and np.all(w[~mask] == 0)
  assert not tr[~mask].any() and np.all(w[tr] == c)  # truncated tokens carry C
  assert not tr[mask & (w < c)].any()  # below C nothing is truncated
  if level == "sequence":
    for b in range(B):
      assert len(set(w[b][mask[b]].tolist())) <= 1 and len(set(tr[b][mask[b]].tolist())) <= 1


def test_weights_pass_no_gradient():
  old, sampler, mask = batch(0, 0.5)
  for level in ("token", "sequence"):
    g = jax.grad(lambda o: jnp.sum(rc.correction(o, sampler, mask, RC(is_level=level)).weights))(
        jnp.asarray(old))
    assert np.all(np.asarray(g) == 0)


@settings(max_examples=25, deadline=None)
@given(values=st.lists(st.floats(-5, 5, width=32), min_size=0, max_size=40),
       drop=st.integers(0, 2**31 - 1))
def test_masked_quantiles_match_numpy(values, drop):
  x = np.zeros(48, np.float32)
  x[:len(values)] = values
  keep = np.zeros(48, bool)
  keep[:len(values)] = np.random.default_rng(drop).random(len(values)) < 0.8
  x[~keep] = 1e6  # never read
  got = np.asarray(rc.masked_quantiles(jnp.asarray(x[None]), jnp.asarray(keep[None])))
  kept = x[keep].astype(np.float64).tolist()
  want = [ref.quantile(kept, q) for q in rc.GAP_QUANTILES]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  if kept:
    np.testing.assert_allclose(got, np.quantile(kept, rc.GAP_QUANTILES), rtol=1e-5, atol=1e-5)


def test_metrics_count_truncated_tokens_and_masked_rows():
  old = np.zeros((3, 4), np.float32)
  sampler = np.array([[0.0, -1.0, 0.0, 0.0],     # one token 1 nat off: ratio e > 2
                      [0.5, 0.5, 0.0, 0.0],      # row sum -1: sequence ratio 1/e < 0.5
                      [0.0, 0.0, 0.0, 0.0]], np.float32)
  mask = np.array([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]], bool)
  m = {k: float(v) for k, v in rc.metrics(
      old, sampler, mask, RC(is_level="token", mask_level="sequence")).items()}
  assert m["truncated_token_share"] == pytest.approx(1 / 9)
  assert m["masked_row_share"] == pytest.approx(2 / 3)  # row 0 (ratio e) and row 1 (1/e)
  assert m["masked_token_share"] == pytest.approx(7 / 9)
  assert m["gap_max"] == pytest.approx(1.0) and m["weight_max"] == pytest.approx(2.0)
  assert m["weight_min"] == pytest.approx(math.exp(-0.5), rel=1e-6)
  assert m["seq_log_ratio_min"] == pytest.approx(-1.0) and m["seq_log_ratio_max"] == pytest.approx(1.0)
  gaps = [1.0, 0.5, 0.5] + [0.0] * 6
  for q in rc.GAP_QUANTILES:
    assert m[f"gap_q{round(100 * q)}"] == pytest.approx(np.quantile(gaps, q), abs=1e-6)
  geo = {k: float(v) for k, v in rc.metrics(old, sampler, mask, RC(mask_level="geometric",
                                                                   mask_low=0.8)).items()}
  assert geo["masked_row_share"] == pytest.approx(1 / 3)  # row 1: exp(-1/3) < 0.8
  assert geo["truncated_token_share"] == 0.0 and geo["weight_min"] == geo["weight_max"] == 1.0


# -- The correction inside the policy loss -------------------------------------------------------

MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")


def loss_inputs(seed, gap=0.5):
  rng = np.random.default_rng(seed)
  old, sampler, mask = batch(seed, gap)
  logp = np.where(mask, old + rng.normal(0, 0.3, (B, L)), 0.0).astype(np.float32)
  adv = np.where(mask, rng.normal(0, 1, (B, L)), 0.0).astype(np.float32)
  row_mask = rng.random(B) < 0.85
  return logp, old, sampler, adv, mask, row_mask


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), mode=st.sampled_from(MODES), opts=OPTION_SETS)
def test_corrected_loss_matches_the_loop_reference(seed, mode, opts):
  logp, old, sampler, adv, mask, row_mask = loss_inputs(seed)
  norm = 7.0 if mode == "seq_mean_token_sum_norm" else None
  got = loss.policy_loss(logp, old, adv, mask, row_mask, loss.LossOptions(
      aggregation=mode, norm_constant=norm, rollout_correction=opts), sampler_logprobs=sampler)
  want = ref.corrected_pg_loss(logp.tolist(), old.tolist(), sampler.tolist(), adv.tolist(),
                               mask.tolist(), row_mask.tolist(), mode=mode, norm=norm,
                               is_level=opts.is_level, threshold=opts.is_threshold,
                               mask_level=opts.mask_level, low=opts.mask_low,
                               high=opts.mask_high)
  assert float(got.pg.value) == pytest.approx(want, rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_mis_is_dropping_the_rows_from_the_loss_and_its_denominator(mode):
  """MIS alone equals the uncorrected loss with the masked rows out of `row_mask`: in value,
  denominator and gradient (verl replaces `response_mask` likewise)."""
  logp, old, sampler, adv, mask, row_mask = loss_inputs(3, gap=0.4)
  norm = 7.0 if mode == "seq_mean_token_sum_norm" else None
  opts = RC(mask_level="sequence", mask_low=0.7, mask_high=1.4)
  keep = np.asarray(rc.correction(old, sampler, mask & row_mask[:, None], opts).keep)
  assert 0 < (row_mask & ~keep & mask.any(1)).sum() < row_mask.sum()  # some rows, not all
  corrected = loss.LossOptions(aggregation=mode, norm_constant=norm, rollout_correction=opts,
                               kl_coef=0.1)
  plain = loss.LossOptions(aggregation=mode, norm_constant=norm, kl_coef=0.1)
  ref_lp = old - 0.2
  f = lambda o, rows, s: lambda lp: loss.policy_loss(lp, old, adv, mask, rows, o,
                                                     ref_logprobs=ref_lp, sampler_logprobs=s)
  a, ga = jax.value_and_grad(lambda lp: f(corrected, row_mask, sampler)(lp).loss.value)(logp)
  b, gb = jax.value_and_grad(lambda lp: f(plain, row_mask & keep, None)(lp).loss.value)(logp)
  assert float(a) == pytest.approx(float(b), rel=1e-6)
  np.testing.assert_allclose(ga, gb, rtol=1e-6, atol=1e-8)
  assert float(f(corrected, row_mask, sampler)(logp).loss.den) == float(
      f(plain, row_mask & keep, None)(logp).loss.den)


@pytest.mark.parametrize("surrogate, dual_clip", [("clip", None), ("clip", 3.0), ("cispo", None)])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_tis_weighs_each_token_as_a_scaled_advantage_would(surrogate, dual_clip, level):
  """w > 0 multiplies the surrogate of every kind (PPO's min, the dual clip, CISPO), so a
  TIS-weighted loss is the uncorrected loss with each token's advantage scaled by its w: the
  KL term (not weighted) and the mask stay as they were."""
  logp, old, sampler, adv, mask, row_mask = loss_inputs(5, gap=0.6)
  opts = RC(is_level=level, is_threshold=1.5)
  w = np.asarray(rc.correction(old, sampler, mask & row_mask[:, None], opts).weights)
  base = dict(surrogate=surrogate, dual_clip=dual_clip, kl_coef=0.05)
  ref_lp = old - 0.3
  fa = lambda lp: loss.policy_loss(lp, old, adv, mask, row_mask, loss.LossOptions(
      **base, rollout_correction=opts), ref_logprobs=ref_lp, sampler_logprobs=sampler).loss.value
  fb = lambda lp: loss.policy_loss(lp, old, adv * w, mask, row_mask, loss.LossOptions(**base),
                                   ref_logprobs=ref_lp).loss.value
  a, ga = jax.value_and_grad(fa)(logp)
  b, gb = jax.value_and_grad(fb)(logp)
  assert float(a) == pytest.approx(float(b), rel=1e-5)
  np.testing.assert_allclose(ga, gb, rtol=1e-5, atol=1e-7)


def test_the_loss_needs_the_samplers_logprobs_when_correcting():
  logp, old, _, adv, mask, row_mask = loss_inputs(0)
  with pytest.raises(ValueError, match="sampler_logprobs: required"):
    loss.policy_loss(logp, old, adv, mask, row_mask,
                     loss.LossOptions(rollout_correction=RC(is_level="token")))
  off = loss.policy_loss(logp, old, adv, mask, row_mask, loss.LossOptions(),
                         sampler_logprobs=old + 5.0)  # off: the sampler's are not read
  plain = loss.policy_loss(logp, old, adv, mask, row_mask, loss.LossOptions())
  assert float(off.loss.value) == float(plain.loss.value)


# -- Options and config -----------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(is_level="tokens"), "is_level: must be one of"),
    (dict(is_threshold=0.5), "is_threshold: must be a finite number >= 1.0"),
    (dict(is_threshold=math.inf), "is_threshold: must be a finite number >= 1.0"),
    (dict(mask_level="product"), "mask_level: must be one of"),
    (dict(mask_low=0.0), "mask_low: must be a finite number > 0"),
    (dict(mask_low=1.5), "mask_low: must be <= 1.0"),
    (dict(mask_high=0.9), "mask_high: must be a finite number >= 1.0")])
def test_bad_options_are_refused_by_name(kwargs, message):
  with pytest.raises(ValueError, match=message):
    RC(**kwargs)


def test_off_by_default_and_a_config_section_of_the_loss():
  assert not loss.LossOptions().rollout_correction.enabled
  section = config_from_dataclass(loss.LossOptions)
  assert dict(section.rollout_correction) == {"is_level": "off", "is_threshold": 2.0,
                                              "mask_level": "off", "mask_low": 0.5,
                                              "mask_high": 2.0}
  got = dataclass_from_config(loss.LossOptions, {"rollout_correction": {
      "is_level": "sequence", "mask_level": "geometric"}}, "loss")
  assert got.rollout_correction == RC(is_level="sequence", mask_level="geometric")
  assert got.rollout_correction.enabled
  with pytest.raises(ValueError, match="loss.rollout_correction: .*is_level"):
    dataclass_from_config(loss.LossOptions, {"rollout_correction": {"is_level": "x"}}, "loss")


def test_the_vllm_servers_dtype_is_an_option_of_the_sampler():
  from tirjax.trainer.sections import SamplerOptions  # pylint: disable=import-outside-toplevel
  assert SamplerOptions().vllm_dtype == ""  # the model's
  assert SamplerOptions(kind="vllm", vllm_dtype="bfloat16").vllm_dtype == "bfloat16"
  with pytest.raises(ValueError, match="vllm_dtype: must be one of"):
    SamplerOptions(kind="vllm", vllm_dtype="float16")


def test_a_correction_on_a_tempered_policy_reads_the_jax_samplers_tempered_logprobs():
  """On the tempered policy (T = 0.6) the correction compares tempered log-probs: the JAX
  sampler is asked for them (`rollout.logprob_temperature`, derived); vLLM, which reports the
  raw model's, is refused below T = 1; without a correction the sampler reports raw ones."""
  from configs import grpo  # pylint: disable=import-outside-toplevel
  from tirjax.trainer import resolve  # pylint: disable=import-outside-toplevel
  c = grpo.get_config("model=tiny")
  with c.unlocked():
    c.train.tempered_policy, c.rollout.temperature = True, 0.6
  assert resolve.resolve(c).rollout.logprob_temperature == 1.0
  with c.unlocked():
    c.loss.rollout_correction.is_level = "token"
  assert resolve.resolve(c).rollout.logprob_temperature == 0.6
  with c.unlocked():
    c.sampler.kind = "vllm"
  with pytest.raises(resolve.ConfigError, match="loss.rollout_correction: with "
                     "train.tempered_policy and sampler.kind=vllm needs rollout.temperature = 1"):
    resolve.resolve(c)
  with c.unlocked():
    c.rollout.temperature = 1.0
  assert resolve.resolve(c).loss.rollout_correction.is_level == "token"


# -- The trainer: the same weights give weights of exactly 1 -----------------------------------

STEP = train_steps.StepOptions(num_microbatches=2, logprob_chunk_size=32)
CORRECTING = loss.LossOptions(rollout_correction=RC(is_level="token", mask_level="sequence"))


@pytest.mark.parametrize("packed", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_the_samplers_own_logprobs_give_weights_of_exactly_one_through_the_trainer(packed):
  """The sampler reports log-probs computed with the trainer's weights and kernels (its
  `TokenLogprobs` pass); the trainer's stage recomputes π_old, logs its correction figures and
  updates: every weight is exactly 1, nothing is truncated or masked, and the corrected
  update is the uncorrected one bit for bit (loss and gradient). (With the JAX sampler the
  weights are 1 within 1e-6, its decode kernels rounding differently:
  `test_a_trainer_run_with_the_jax_sampler_logs_the_correction`.)"""
  graphdef, params, tx, place, state = ts.setup()
  opts = train_steps.StepOptions(**{**STEP.__dict__, "packed": packed})
  own = train_steps.TokenLogprobs(graphdef, place, opts)
  sampled = train_steps.with_policy_logprobs(ts.tiny_rollouts(), own, params)  # "the sampler"
  r = stages._with_reference_and_old_logprobs(sampled, None, own, state, CORRECTING)
  adv = advantages.get("grpo")(r)
  m = rl_metrics.rollout_correction_metrics(r, sampled.old_logprobs, adv.row_mask,
                                            CORRECTING.rollout_correction)
  assert m["rollout_corr/weight_min"] == m["rollout_corr/weight_max"] == 1.0
  assert m["rollout_corr/gap_max"] == 0.0
  assert m["rollout_corr/truncated_token_share"] == m["rollout_corr/masked_row_share"] == 0.0
  grads, metrics = [], []
  for loss_opts, smp in ((CORRECTING, sampled.old_logprobs), (loss.LossOptions(), None)):
    step = train_steps.policy_step(graphdef, tx, place, loss_opts, opts)
    fresh = train_steps.init_state(params, tx, place, jax.random.key(0))
    batch = train_steps.policy_batch(r, adv, smp)
    fresh, out = step(fresh, step.prepare(batch, np.asarray(r.group_id))(None)
                      if packed else batch)
    grads.append(jax.tree.leaves(fresh.opt_state[0].grads))
    metrics.append(jax.device_get(out))
  assert metrics[0]["loss"] == metrics[1]["loss"] and metrics[0]["tokens/loss"] > 0
  assert metrics[0]["tokens/loss"] == metrics[1]["tokens/loss"]
  for a, b in zip(*grads):
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("tempered", [
    {}, pytest.param({"rollout.temperature": 0.6, "train.tempered_policy": True},
                     marks=pytest.mark.slow)])
def test_a_trainer_run_with_the_jax_sampler_logs_the_correction(tmp_path, tempered):
  """Two RL steps of GRPO (JAX sampler, T = 1, or the tempered policy at T = 0.6, whose
  log-probs the sampler then reports) with token TIS and sequence MIS: every step logs the gap
  and the correction's shares; the sampler's weights are the trainer's, so the weights are 1
  within its decode kernels' rounding, and nothing is truncated or masked."""
  from tirjax.rundir import RunDir  # pylint: disable=import-outside-toplevel
  from tirjax.testing.short_runs import short_config  # pylint: disable=import-outside-toplevel
  from tirjax.trainer.train import run  # pylint: disable=import-outside-toplevel
  run(short_config("grpo", **{"loss.rollout_correction.is_level": "token",
                              "loss.rollout_correction.mask_level": "sequence",
                              "train.export_final": False, **tempered}), str(tmp_path))
  rl = RunDir(str(tmp_path)).metrics("rl")
  assert [r["step"] for r in rl] == [1, 2]
  for r in rl:
    assert 0 <= r["rollout_corr/gap_q50"] <= r["rollout_corr/gap_q99"] <= r[
        "rollout_corr/gap_max"] < 1e-5
    assert abs(r["rollout_corr/weight_min"] - 1) < 1e-5 and abs(r["rollout_corr/weight_max"] - 1) < 1e-5
    assert r["rollout_corr/truncated_token_share"] == r["rollout_corr/masked_row_share"] == 0.0
    assert r["loss/metrics/ratio/min"] == r["loss/metrics/ratio/max"] == 1.0  # π_old recomputed
    assert "sampler/logprob_gap_max" not in r  # its first-update ratio is now 1 by construction


# -- A perturbed sampler: the corrected gradient against the on-policy gradient ----------------

EXACT_IS = RC(is_level="sequence", is_threshold=1e6)


@pytest.fixture(scope="module")
def problems():
  """The `offpolicy_gradients` problems by perturbation, made when first asked for."""
  made = {}

  def get(perturbation):
    if perturbation not in made:
      made[perturbation] = og.Problem(og.Setup(perturbation=perturbation, temperature=1.5))
    return made[perturbation]

  return get


@pytest.mark.parametrize("perturbation", ["temperature", "bf16"])
def test_sequence_is_makes_the_expected_gradient_the_on_policy_one(problems, perturbation):
  """Every continuation enumerated (8^3): under a sampler at T = 1.5, or with bf16-rounded
  weights, the uncorrected loss's expected gradient is off the on-policy one (by 351% and 2%),
  and untruncated sequence-level IS makes it equal, up to float rounding (≤ 1e-6)."""
  problem = problems(perturbation)
  target = problem.on_policy()
  plain = og.compare(problem.expected(None), target)
  corrected = og.compare(problem.expected(EXACT_IS), target)
  assert corrected["relative_error"] < 1e-5 < 1e-2 < plain["relative_error"]
  assert corrected["cosine"] > plain["cosine"]


def test_sampled_sequence_is_lands_near_the_on_policy_gradient(problems):
  """4096 continuations drawn from the sampler at T = 1.5: the corrected estimate lands within
  10% of the on-policy gradient, the uncorrected one 3.5 times its norm away. (bf16's bias,
  2%, is below the noise of 4096 draws, 5%: there only the expectation tells them apart.)"""
  problem = problems("temperature")
  target = problem.on_policy()
  plain = og.compare(problem.sampled(None, 4096, seed=0), target)
  corrected = og.compare(problem.sampled(EXACT_IS, 4096, seed=0), target)
  assert corrected["relative_error"] < 0.1 < 1.0 < plain["relative_error"]
  assert corrected["cosine"] > plain["cosine"]
