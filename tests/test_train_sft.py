"""The SFT step: its loss is the masked next-token cross-entropy (against a float64 loop over
dense logits), masked tokens do not matter, it decreases the loss on a fixed batch, and it
accumulates micro-batches exactly."""

import jax
import numpy as np
import pytest
from flax import nnx

from tirjax.testing import train_setup as ts
from tirjax.testing.compile_counts import count_compiles
from tirjax.testing.reference import train_step as ref
from tirjax import sharding, train_steps

STEP = train_steps.StepOptions(num_microbatches=2, logprob_chunk_size=32)
FAST = train_steps.OptimizerOptions(learning_rate=3e-2, eps=1e-4, max_grad_norm=1.0)


@pytest.fixture(scope="module")
def model():
  return ts.setup((2, 2, 2), tx=ts.optimizer(FAST))


@pytest.fixture(scope="module")
def step(model):
  graphdef, _, tx, place, _ = model
  return train_steps.sft_step(graphdef, tx, place, train_steps.SFTLossOptions(), STEP)


@pytest.fixture(scope="module")
def batch():
  return ts.sft_batch(np.random.default_rng(0), rows=8, length=12)


def fresh_state(model):
  _, params, tx, place, _ = model
  return train_steps.init_state(params, tx, place, jax.random.key(0))


def test_loss_is_the_masked_cross_entropy(model, step, batch):
  graphdef, params, _, place, _ = model
  logits = nnx.merge(graphdef, params)(batch.tokens, batch.token_valid)
  want = ref.sft_nll(logits, batch.tokens, batch.token_valid, batch.loss_mask)
  _, metrics = step(fresh_state(model), sharding.shard_batch(batch, place.mesh))
  np.testing.assert_allclose(float(metrics["loss"]), want, rtol=1e-5)
  targets = batch.loss_mask.copy()
  targets[:, 0] = False
  assert float(metrics["tokens/loss"]) == targets.sum()
  assert float(metrics["tokens/valid"]) == batch.token_valid.sum()


def test_decreases_the_loss_on_a_fixed_batch(model, step, batch):
  state, metrics = step(fresh_state(model), batch)
  losses = [float(metrics["loss"])]
  with count_compiles() as compiles:
    for _ in range(5):
      state, metrics = step(state, batch)
      losses.append(float(metrics["loss"]))
  assert all(b < a for a, b in zip(losses, losses[1:])), losses
  assert losses[-1] < 0.9 * losses[0]
  assert not compiles


def test_masked_tokens_do_not_matter(model, step, batch):
  """Trailing masked tokens (after each row's last target) and padding may be anything, and a
  loss-mask bit on position 0 (which nothing predicts) changes nothing: same loss, same
  update."""
  rng = np.random.default_rng(1)
  last = np.array([np.flatnonzero(m).max() for m in batch.loss_mask])
  after = np.arange(batch.tokens.shape[1])[None] > last[:, None]
  assert after.any()
  changed = batch.replace(tokens=np.where(after, rng.integers(-1, ts.VOCAB, after.shape),
                                          batch.tokens).astype(np.int32),
                          loss_mask=batch.loss_mask | (np.arange(12)[None] == 0))
  a, metrics_a = step(fresh_state(model), batch)
  b, metrics_b = step(fresh_state(model), changed)
  assert float(metrics_a["loss"]) == float(metrics_b["loss"])
  for x, y in zip(ref.flatten(a.params), ref.flatten(b.params)):
    np.testing.assert_array_equal(x, y)


def test_all_masked_is_zero(model, step, batch):
  empty = batch.replace(loss_mask=np.zeros_like(batch.loss_mask))
  new, metrics = step(fresh_state(model), empty)
  assert float(metrics["loss"]) == 0.0 and float(metrics["grad_norm"]) == 0.0
  assert all(not np.any(g) for g in ref.flatten(new.opt_state[0].grads))


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_microbatches_equal_one_batch(model, batch, aggregation):
  """Same gradient with 1 and 4 micro-batches under per-token and per-row weighting."""
  graphdef, _, tx, place, _ = model
  opts = train_steps.SFTLossOptions(aggregation=aggregation)
  grads = []
  for num in (1, 4):
    step = train_steps.sft_step(graphdef, tx, place, opts,
                             train_steps.StepOptions(num_microbatches=num, logprob_chunk_size=32))
    new, _ = step(fresh_state(model), batch)
    grads.append(ref.flatten(new.opt_state[0].grads))
  for x, y in zip(*grads):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("change, match", [
    (dict(aggregation="sum"), "aggregation"),
    (dict(aggregation="seq_mean_token_sum_norm"), "norm_constant"),
    (dict(norm_constant=-1.0), "norm_constant"),
])
def test_invalid_sft_options_name_the_option(change, match):
  with pytest.raises(ValueError, match=match):
    train_steps.SFTLossOptions(**change)
