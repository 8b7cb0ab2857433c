"""The critic's packed update equals its padded one (issue 53, tirjax/train_steps/critic_packed.py):
the same value loss, clip fraction, token counts, gradients and updated critic parameters
(1e-5 relative), under every aggregation mode with the value clip acting, with micro-batches by
token budget and mini-batches of whole groups, over two epochs.

Batches mix PORTool trees (shared steps), independent groups (a shared prompt only), irregular
trees whose rows end inside one another or carry no step, and padding rows, with ragged rows
and tool responses inside them; the budget is small, so forests share sequences and an update
has several micro-batches.
"""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tirjax import advantages, sharding, train_steps
from tirjax.models.value import from_policy
from tirjax.testing import strategies, train_setup as ts
from tirjax.testing.reference import train_step as ref
from tirjax.train_steps.critic import Critic, critic_batch
from tirjax.train_steps.critic_packed import PackedValueStep

PADDED = train_steps.StepOptions(logprob_chunk_size=32)
PACKED = dataclasses.replace(PADDED, packed=True, attention_block=8,
                             max_tokens_per_microbatch=48)
MODES = {"token_mean": None, "seq_mean_token_mean": None, "seq_mean_token_sum_norm": 12.0,
         "seq_mean_token_sum": None}
TOL = 1e-5


def build(opts, aggregation, norm_constant, cliprange_value=0.05):
  """A critic (random head, so values vary by token) whose optimizer records its gradients."""
  graphdef, params, _, _, state = ts.setup()
  vgraph, vparams = train_steps.split_model(from_policy(nnx.merge(graphdef, params)))
  tx = ts.optimizer()
  place = train_steps.placement(vparams, tx, ts.mesh((1, 1, 1)), sharding.DEFAULT_RULES)
  critic = Critic(vgraph, tx, place, cliprange_value, aggregation, norm_constant, opts)
  cp, copt = critic.init(graphdef, params)
  rng = np.random.default_rng(0)
  cp["head_w"].value = jnp.asarray(rng.standard_normal(cp["head_w"].value.shape), jnp.float32)
  cp["head_b"].value = jnp.asarray(0.25, jnp.float32)
  return critic, dataclasses.replace(state, critic_params=cp, critic_opt_state=copt)


def targets(seed):
  """A `CriticBatch` of mixed rollouts: `ppo`'s returns on the padded critic's values, and old
  values moved off them so that the clip acts from the first update."""
  r = strategies.mixed_rollouts(np.random.default_rng(seed), num_rows=32, prompt_tokens=7,
                                step_tokens=3, response_tokens=2, vocab_size=ts.VOCAB)
  critic, state = build(PADDED, "token_mean", None)
  r = r.replace(values=critic.values(state.critic_params, r))
  spec = advantages.get("ppo")
  batch = critic_batch(r, spec(r, spec.make_options({})))
  noise = np.random.default_rng(seed + 1).normal(0, 0.1, np.shape(batch.old_values))
  batch = batch.replace(old_values=jnp.asarray(batch.old_values + noise, jnp.float32))
  return r, batch


def update(opts, mode, batch, r, minibatches):
  critic, state = build(opts, mode, MODES[mode])
  return critic.update(state, batch, np.asarray(r.group_id), np.asarray(r.row_valid),
                       minibatches, 2, seed=3, step=0), critic


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("seed,minibatches", [(0, 1), (1, 2)])
def test_packed_update_equals_the_padded_one(mode, seed, minibatches):
  r, batch = targets(seed)
  (new, updates), packed = update(PACKED, mode, batch, r, minibatches)
  (want, updates_want), padded = update(PADDED, mode, batch, r, minibatches)
  assert isinstance(packed.step, PackedValueStep) and packed.step.packer.high is not None
  assert not isinstance(padded.step, PackedValueStep) and padded.step.packer is None
  assert packed.step.packer.high.microbatches > 1  # accumulated over several micro-batches
  assert len(updates) == 2 * minibatches
  for u, w in zip(updates, updates_want, strict=True):
    for k in ("loss", "clipfrac", "error", "tokens/value", "tokens/valid"):
      np.testing.assert_allclose(float(u[k]), float(w[k]), rtol=TOL, atol=1e-7, err_msg=k)
    assert float(u["tokens/forwarded"]) < float(w["tokens/forwarded"])  # prefixes once
  assert float(updates[0]["clipfrac"]) > 0 and float(updates[0]["tokens/value"]) > 50
  for tree, tree_want in [(new.critic_opt_state[0].grads, want.critic_opt_state[0].grads),
                          (new.critic_params, want.critic_params)]:
    for a, b in zip(ref.flatten(tree), ref.flatten(tree_want), strict=True):
      scale = float(np.max(np.abs(b))) or 1.0
      np.testing.assert_allclose(a, b, rtol=TOL, atol=TOL * scale)
  assert float(updates[-1]["grad_norm"]) > 0.01  # the comparison has something to compare


def test_an_update_without_value_tokens_is_a_zero_gradient():
  r, batch = targets(0)
  batch = batch.replace(value_mask=jnp.zeros_like(batch.value_mask))
  (new, updates), _ = update(PACKED, "token_mean", batch, r, 1)
  assert all(float(u["tokens/value"]) == 0 and float(u["loss"]) == 0 for u in updates)
  assert all(not np.any(a) for a in ref.flatten(new.critic_opt_state[0].grads))
