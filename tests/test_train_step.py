"""The policy step as a training loop uses it: compiles once per batch shape, donates and
advances a checkpointable TrainState, handles an all-masked batch, tempered log-probs and
entropy metrics, and resumes from a checkpoint exactly."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from tirjax.testing import train_setup as ts
from tirjax.testing.compile_counts import count_compiles
from tirjax.testing.reference import model_logprobs
from tirjax.testing.reference import train_step as ref
from tirjax import checkpoint as ck
from tirjax import loss, train_steps
from tirjax.loss.aggregation import aggregate

LOSS = loss.LossOptions(clip_high=0.28)
STEP = train_steps.StepOptions(num_microbatches=2, logprob_chunk_size=32)


@pytest.fixture(scope="module")
def model():
  return ts.setup((2, 2, 2))


@pytest.fixture(scope="module")
def step(model):
  graphdef, _, tx, place, _ = model
  return train_steps.policy_step(graphdef, tx, place, LOSS, STEP)


def fresh_state(model, **kwargs):
  _, params, tx, place, _ = model
  return train_steps.init_state(params, tx, place, jax.random.key(3), **kwargs)


def test_compiles_once_per_batch_shape(model, step):
  state = fresh_state(model, data_position={"index": 7}, policy_version=2)
  rng = np.random.default_rng(0)
  losses = []
  with count_compiles() as compiles:
    for _ in range(3):
      state, metrics = step(state, ts.policy_batch(rng, rows=16, length=12))
      losses.append(float(metrics["loss"]))
  assert len(compiles) == 1
  assert len(set(losses)) == 3
  assert state.step == 3 and state.data_position == {"index": 7} and state.policy_version == 2
  with count_compiles() as compiles:
    state, _ = step(state, ts.policy_batch(rng, rows=16, length=20))
  assert len(compiles) == 1


def test_state_is_donated(model, step):
  state = fresh_state(model)
  new, _ = step(state, ts.policy_batch(np.random.default_rng(1)))
  assert all(x.is_deleted() for x in jax.tree.leaves(state.params))
  adam = state.opt_state[1][1].inner_state[0]
  assert all(x.is_deleted() for x in jax.tree.leaves((adam.mu, adam.nu)))
  assert not any(x.is_deleted() for x in jax.tree.leaves(new.params))


def test_all_masked_batch_is_a_zero_gradient(model, step):
  """No row in the loss: loss 0, gradient exactly 0, and AdamW moves the parameters by the
  weight decay alone: p ← p − η₀·λ·p."""
  _, params, _, _, _ = model
  batch = ts.policy_batch(np.random.default_rng(2))
  batch = batch.replace(row_mask=np.zeros_like(batch.row_mask))
  new, metrics = step(fresh_state(model), batch)
  assert float(metrics["loss"]) == 0.0 and float(metrics["grad_norm"]) == 0.0
  assert float(metrics["tokens/loss"]) == 0.0
  assert all(np.isfinite(float(v)) for v in metrics.values())
  assert all(not np.any(g) for g in ref.flatten(new.opt_state[0].grads))
  lr0 = float(metrics["learning_rate"])
  assert lr0 == pytest.approx(ts.OPTIMIZER.learning_rate / (ts.OPTIMIZER.warmup_steps + 1))
  for got, p in zip(ref.flatten(new.params), ref.flatten(params)):
    np.testing.assert_allclose(got, p * (1 - lr0 * ts.OPTIMIZER.weight_decay), rtol=1e-6)


def test_temperature_and_entropy_metrics(model):
  """With τ ≠ 1 the step's log-probs are the tempered distribution's, and `log_entropy`
  reports the entropy without an entropy term in the loss."""
  graphdef, params, tx, place, _ = model
  opts = dataclasses.replace(STEP, temperature=0.7, log_entropy=True)
  step = train_steps.policy_step(graphdef, tx, place, LOSS, opts)
  batch = ts.policy_batch(np.random.default_rng(3))
  want = ref.full_batch_policy_objective(graphdef, params, batch, LOSS, temperature=0.7)
  model_ = nnx.merge(graphdef, params)
  _, entropy = model_logprobs.dense_logprobs(model_.hidden(batch.tokens, batch.token_valid),
                                             model_.unembedding, batch.tokens,
                                             batch.token_valid, 0.7)
  mask = batch.loss_mask & batch.row_mask[:, None]
  _, metrics = step(fresh_state(model), batch)
  np.testing.assert_allclose(float(metrics["loss"]), float(want), rtol=1e-5)
  np.testing.assert_allclose(float(metrics["entropy"]),
                             float(aggregate(entropy, mask, LOSS.aggregation).value), rtol=1e-5)
  assert "metrics/entropy/mean" in metrics and "kl" not in metrics


def test_kl_without_reference_logprobs_is_an_error(model):
  graphdef, _, tx, place, _ = model
  step = train_steps.policy_step(graphdef, tx, place, loss.LossOptions(kl_coef=0.001), STEP)
  with pytest.raises(ValueError, match="ref_logprobs: required when kl_coef > 0"):
    step(fresh_state(model), ts.policy_batch(np.random.default_rng(4)))


def test_resume_from_a_checkpoint(model, step, tmp_path):
  """Save after one step, restore onto the placement's shardings, and the next step matches
  the uninterrupted run."""
  _, _, _, place, _ = model
  rng = np.random.default_rng(5)
  batches = [ts.policy_batch(rng) for _ in range(2)]
  state, _ = step(fresh_state(model, data_position={"index": 1}), batches[0])
  with ck.Checkpointer(str(tmp_path), "run", ck.CheckpointOptions(async_save=False)) as c:
    c.save(state)
    target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          (state.params, state.opt_state), (place.params, place.opt_state))
    restored = c.restore(dataclasses.replace(state, params=target[0], opt_state=target[1]))
  assert restored.step == 1 and restored.data_position == {"index": 1}
  a, metrics_a = step(state, batches[1])
  b, metrics_b = step(restored, batches[1])
  assert float(metrics_a["loss"]) == float(metrics_b["loss"])
  for x, y in zip(ref.flatten(a.params), ref.flatten(b.params)):
    np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("change, match", [
    (dict(num_microbatches=0), "num_microbatches"),
    (dict(logprob_chunk_size=0), "logprob_chunk_size"),
    (dict(temperature=0.0), "temperature"),
    (dict(temperature=float("inf")), "temperature"),
])
def test_invalid_step_options_name_the_option(change, match):
  with pytest.raises(ValueError, match=match):
    train_steps.StepOptions(**change)


def test_microbatches_must_divide_the_batch(model):
  graphdef, _, tx, place, _ = model
  step = train_steps.policy_step(graphdef, tx, place, LOSS,
                              train_steps.StepOptions(num_microbatches=3))
  with pytest.raises(ValueError, match="num_microbatches: 3 does not divide the batch of 16"):
    step(fresh_state(model), ts.policy_batch(np.random.default_rng(6)))
