"""Reference log-probs: computed once per batch under the frozen reference weights when the
KL weight β > 0, and never computed when β = 0."""

import jax
import numpy as np
import pytest
from flax import nnx

from tirjax.testing import train_setup as ts
from tirjax.testing.compile_counts import count_compiles, count_traces
from tirjax.testing.reference import model_logprobs
from tirjax.testing.reference import train_step as ref
from tirjax import advantages, loss, train_steps
from tirjax.models import decoder
from tirjax.testing.records import GroupRecord, RowRecord, StepRecord, build_rollouts

STEP = train_steps.StepOptions(num_microbatches=2, logprob_chunk_size=32, temperature=0.8)
KL = loss.LossOptions(kl_coef=0.05, kl_estimator="k3")


def rollouts(seed, groups=4, length=12):
  """Groups of two rows, outcomes +1 / -1, random tokens of the tiny vocabulary."""
  rng = np.random.default_rng(seed)
  tok = lambda n: tuple(int(t) for t in rng.integers(0, ts.VOCAB, n))
  out = []
  for _ in range(groups):
    rows = [RowRecord(outcome=o, prompt_tokens=tok(2), steps=[
        StepRecord(tokens=tok(3), logprobs=tuple(rng.normal(-4.0, 0.3, 3)),
                   response_tokens=tok(2)),
        StepRecord(tokens=tok(int(rng.integers(1, 4))))]) for o in (1, -1)]
    out.append(GroupRecord(rows=rows))
  return build_rollouts(out, max_tokens=length)


@pytest.fixture(scope="module")
def model():
  """The policy starts from seed 0; the reference is another model (seed 1), so KL > 0."""
  graphdef, params, tx, place, _ = ts.setup((2, 2, 2))
  _, ref_params = train_steps.split_model(decoder.init(ts.CONFIG, 1))
  return graphdef, params, ref_params, tx, place


def test_zero_kl_computes_nothing(model):
  graphdef, params, ref_params, _, place = model
  reference = train_steps.ReferencePolicy(graphdef, ref_params, place, STEP)
  r = rollouts(0)
  for given in (reference, None):
    with count_compiles() as compiles:
      out = train_steps.with_reference_logprobs(r, given, loss.LossOptions(kl_coef=0.0))
    assert out is r and out.ref_logprobs is None and not compiles


def test_positive_kl_needs_a_reference():
  with pytest.raises(ValueError, match="reference: a ReferencePolicy is required"):
    train_steps.with_reference_logprobs(rollouts(0), None, KL)


def test_reference_logprobs_match_the_dense_reference(model):
  """Micro-batched, chunked and tempered like the policy's; compiled once for a shape."""
  graphdef, _, ref_params, _, place = model
  reference = train_steps.ReferencePolicy(graphdef, ref_params, place, STEP)
  filled = [train_steps.with_reference_logprobs(rollouts(0), reference, KL)]
  second = rollouts(1)
  with count_traces() as traces:
    filled.append(train_steps.with_reference_logprobs(second, reference, KL))
  assert not traces  # the second batch, of the first's shape
  m = nnx.merge(graphdef, ref_params)
  for r in filled:
    want, _ = model_logprobs.dense_logprobs(m.hidden(r.tokens, r.token_valid), m.unembedding,
                                            r.tokens, r.token_valid, STEP.temperature)
    np.testing.assert_allclose(r.ref_logprobs, want, rtol=1e-5, atol=1e-6)
    assert r.ref_logprobs.sharding == place.batch


def test_kl_enters_the_policy_step(model):
  """β > 0: the loss is pg + β·KL(policy ‖ reference); the reference keeps its own weights
  while the policy's are donated and updated."""
  graphdef, params, ref_params, tx, place = model
  reference = train_steps.ReferencePolicy(graphdef, ref_params, place, STEP)
  step = train_steps.policy_step(graphdef, tx, place, KL, STEP)
  state = train_steps.init_state(params, tx, place, jax.random.key(0))
  r = train_steps.with_reference_logprobs(rollouts(2), reference, KL)
  batch = train_steps.policy_batch(r, advantages.get("grpo")(r))
  want = ref.full_batch_policy_objective(graphdef, params, batch, KL, STEP.temperature)
  before = np.asarray(r.ref_logprobs)
  state, metrics = step(state, batch)
  assert float(metrics["kl"]) > 1e-3
  np.testing.assert_allclose(float(metrics["loss"]),
                             float(metrics["pg"]) + KL.kl_coef * float(metrics["kl"]), rtol=1e-5)
  np.testing.assert_allclose(float(metrics["loss"]), float(want), rtol=1e-5)
  again = train_steps.with_reference_logprobs(r.replace(ref_logprobs=None), reference, KL)
  np.testing.assert_array_equal(again.ref_logprobs, before)
  # Without the KL term the same batch gives a different loss: β > 0 used the log-probs.
  plain = train_steps.policy_step(graphdef, tx, place, loss.LossOptions(), STEP)
  fresh = train_steps.init_state(params, tx, place, jax.random.key(0))
  _, metrics_plain = plain(fresh, batch.replace(ref_logprobs=None))
  assert "kl" not in metrics_plain
  np.testing.assert_allclose(float(metrics_plain["loss"]), float(metrics["pg"]), rtol=1e-5)


def test_own_logprobs_are_the_policy_at_the_step_temperature(model):
  """`train.tempered_policy`: π_old recomputed under the current parameters at the step's
  temperature equals the dense tempered log-probs; the first update then sees ρ = 1 (nothing
  clipped), whatever the sampler reported."""
  graphdef, params, _, tx, place = model
  own = train_steps.TokenLogprobs(graphdef, place, STEP)
  r = train_steps.with_policy_logprobs(rollouts(2), own, params)
  m = nnx.merge(graphdef, params)
  want, _ = model_logprobs.dense_logprobs(m.hidden(r.tokens, r.token_valid), m.unembedding,
                                          r.tokens, r.token_valid, STEP.temperature)
  np.testing.assert_allclose(r.old_logprobs, want, rtol=1e-5, atol=1e-6)
  adv = advantages.get("grpo")(r, advantages.get("grpo").make_options({}))
  step = train_steps.policy_step(graphdef, tx, place, loss.LossOptions(), STEP)
  state = train_steps.init_state(params, tx, place, jax.random.key(0))
  _, metrics = step(state, train_steps.policy_batch(r, adv))
  np.testing.assert_allclose(float(metrics["metrics/ratio/std"]), 0.0, atol=1e-5)
  assert float(metrics["metrics/clip_frac_low"]) == float(metrics["metrics/clip_frac_high"]) == 0
