"""Gradient accumulation is exact: 1, 2 and 4 micro-batches give the full-batch step (loss,
gradient, updated parameters) under every aggregation mode.

The full-batch step is the reference's: the gradient of `policy_loss(...).loss.value` over
the whole batch, with log-probs from dense `[B, L, V]` logits (no chunking, no scan), then
the same optimizer update.
"""

import jax
import numpy as np
import pytest

from tirjax.testing import train_setup as ts
from tirjax.testing.reference import train_step as ref
from tirjax import loss, train_steps

pytestmark = pytest.mark.slow  # left out of `make test-fast`

MODES = {
    "token_mean": loss.LossOptions(aggregation="token_mean", clip_high=0.28),
    "seq_mean_token_mean": loss.LossOptions(dual_clip=3.0),
    "seq_mean_token_sum_norm": loss.LossOptions(aggregation="seq_mean_token_sum_norm",
                                                norm_constant=12.0, entropy_coef=0.01),
    "seq_mean_token_sum": loss.LossOptions(aggregation="seq_mean_token_sum", kl_coef=0.05),
}


@pytest.fixture(scope="module")
def model():
  return ts.setup()


@pytest.fixture(scope="module")
def batch():
  return ts.policy_batch(np.random.default_rng(0), rows=16, length=12, with_ref=True)


@pytest.fixture(scope="module")
def want(model, batch):
  """The reference full-batch step of every mode: loss, grads, new params."""
  graphdef, params, tx, _, state = model
  out = {}
  for mode, opts in MODES.items():
    objective = lambda p, opts=opts: ref.full_batch_policy_objective(graphdef, p, batch, opts)
    loss_value, grads, new, _ = jax.jit(
        lambda p, s: ref.full_batch_step(graphdef, p, s, tx, objective))(params, state.opt_state)
    out[mode] = (float(loss_value), ref.flatten(grads), ref.flatten(new))
  return out


@pytest.mark.parametrize("num", [1, 2, 4])
@pytest.mark.parametrize("mode", MODES)
def test_microbatches_equal_the_full_batch_step(model, batch, want, mode, num):
  graphdef, params, tx, place, _ = model
  state = train_steps.init_state(params, tx, place, jax.random.key(0))
  step = train_steps.policy_step(graphdef, tx, place, MODES[mode],
                              train_steps.StepOptions(num_microbatches=num, logprob_chunk_size=40))
  new, metrics = step(state, batch)
  want_loss, want_grads, want_params = want[mode]
  np.testing.assert_allclose(float(metrics["loss"]), want_loss, rtol=1e-5, atol=1e-7)
  got_grads = ref.flatten(new.opt_state[0].grads)
  scale = max(np.abs(g).max() for g in want_grads)
  assert scale > 1e-3  # the batch has a gradient worth comparing
  for got, w in zip(got_grads, want_grads):
    np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-6 * scale)
  # Clipping is active, so the update depends on the gradient's global norm too.
  assert float(metrics["grad_norm"]) > ts.OPTIMIZER.max_grad_norm
  for got, w in zip(ref.flatten(new.params), want_params):
    np.testing.assert_allclose(got, w, rtol=0, atol=1e-6)
  assert new.step == 1
  assert float(metrics["tokens/loss"]) == np.sum(batch.loss_mask & batch.row_mask[:, None])
