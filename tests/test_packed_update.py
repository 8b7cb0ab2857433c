"""The packed update equals the padded one (issue 38): every shared token computed once, the
same log-probs, loss and gradients (1e-5 relative), under every aggregation mode with KL and
entropy, for rows of tree and independent estimators, on one device and on meshes of the 8
simulated devices, with micro-batches by token budget and mini-batches of whole groups; and a
run's updates compile a handful of executables.

Batches mix PORTool trees (shared steps), independent groups (a shared prompt only), irregular
trees whose rows end inside one another or carry no step, and padding rows; the packing budget
is small, so forests share sequences and a step has several micro-batches.
"""

import dataclasses
import json

import jax
import numpy as np
import pytest
from hypothesis import given, settings

from tirjax import advantages, loss, train_steps
from tirjax.models import tree_attention
from tirjax.testing import strategies, synthetic, train_setup as ts
from tirjax.testing.compile_counts import compiled_functions
from tirjax.testing.reference import train_step as ref
from tirjax.train_steps.minibatches import update_passes

PADDED = train_steps.StepOptions(logprob_chunk_size=32)
PACKED = dataclasses.replace(PADDED, packed=True, attention_block=8,
                             max_tokens_per_microbatch=48)
MODES = {  # every mode, each with the KL and entropy terms on and the clip acting
    "token_mean": loss.LossOptions(aggregation="token_mean", clip_high=0.28, kl_coef=0.05,
                                   entropy_coef=0.01),
    "seq_mean_token_mean": loss.LossOptions(dual_clip=3.0, kl_coef=0.05, entropy_coef=0.01,
                                            kl_estimator="k1"),
    "seq_mean_token_sum_norm": loss.LossOptions(aggregation="seq_mean_token_sum_norm",
                                                norm_constant=12.0, kl_coef=0.05,
                                                entropy_coef=0.01, ratio_level="sequence"),
    "seq_mean_token_sum": loss.LossOptions(aggregation="seq_mean_token_sum", kl_coef=0.05,
                                           entropy_coef=0.01, kl_estimator="k2"),
}
ROWS = 32  # 16 per mini-batch of 2: whole on the 8 batch shards
TOL = 1e-5


def mixed_rollouts(seed: int):
  """Trees (n = 5, 3), independent groups (4, 1: a singleton) and an irregular tree, then
  padding rows; prompts of 7 tokens, steps of 3 generated + 2 tool-response tokens."""
  return strategies.mixed_rollouts(np.random.default_rng(seed), num_rows=ROWS, prompt_tokens=7,
                                   step_tokens=3, response_tokens=2, vocab_size=ts.VOCAB)


def batch_of(rollouts, estimator: str):
  spec = advantages.get(estimator)
  return train_steps.policy_batch(rollouts, spec(rollouts, spec.make_options({})))


@pytest.fixture(scope="module")
def rollouts():
  return mixed_rollouts(0)


def run_step(shape, opts, loss_opts, batch, group_id, row_valid, minibatches=1):
  graphdef, _, tx, place, state = ts.setup(shape)
  step = train_steps.policy_step(graphdef, tx, place, loss_opts, opts)
  new, updates = update_passes(state, step, batch, group_id, row_valid, minibatches, 1,
                               seed=0, step=0)
  return new, updates


def assert_same_step(got, want):
  (new, updates), (new_want, updates_want) = got, want
  for u, w in zip(updates, updates_want, strict=True):
    for k in ("loss", "pg", "kl", "entropy", "tokens/loss", "tokens/valid"):
      np.testing.assert_allclose(float(u[k]), float(w[k]), rtol=TOL, atol=1e-7, err_msg=k)
  for tree, tree_want in [(new.opt_state[0].grads, new_want.opt_state[0].grads),
                          (new.params, new_want.params)]:
    for a, b in zip(ref.flatten(tree), ref.flatten(tree_want), strict=True):
      scale = float(np.max(np.abs(b))) or 1.0
      np.testing.assert_allclose(a, b, rtol=TOL, atol=TOL * scale)
  assert float(updates[0]["grad_norm"]) > 0.01  # the comparison has something to compare


@pytest.mark.parametrize("estimator", ["portool", "grpo"])
@pytest.mark.parametrize("mode", MODES)
def test_packed_step_equals_the_padded_step(rollouts, mode, estimator):
  batch = batch_of(rollouts, estimator)
  gid, valid = np.asarray(rollouts.group_id), np.asarray(rollouts.row_valid)
  want = run_step((1, 1, 1), PADDED, MODES[mode], batch, gid, valid)
  got = run_step((1, 1, 1), PACKED, MODES[mode], batch, gid, valid)
  assert_same_step(got, want)
  forwarded = [float(u["tokens/forwarded"]) for u in (want[1][0], got[1][0])]
  assert forwarded[1] < forwarded[0]  # shared prefixes and padding not computed


def test_attention_in_chunks_is_the_same_step(rollouts, monkeypatch):
  """Query blocks a chunk at a time (here 2 blocks of 8, as long sequences run), forward and
  rematerialised backward: the padded step's loss and gradients still."""
  monkeypatch.setattr(tree_attention, "_SCORES_PER_CHUNK", 2 * 8 * 48 * 4)
  batch = batch_of(rollouts, "portool")
  gid, valid = np.asarray(rollouts.group_id), np.asarray(rollouts.row_valid)
  opts = MODES["token_mean"]
  packed = dataclasses.replace(PACKED, max_tokens_per_microbatch=128)
  assert tree_attention._chunk_blocks(16, 8 * 48 * 4) == 2  # pylint: disable=protected-access
  assert_same_step(run_step((1, 1, 1), packed, opts, batch, gid, valid),
                   run_step((1, 1, 1), PADDED, opts, batch, gid, valid))


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(8, 1, 1), (2, 2, 2)])
def test_packed_step_on_the_mesh_with_minibatches(rollouts, shape):
  """Sequences and their rows over the batch shards; 2 mini-batches of whole groups, each
  several micro-batches by the token budget."""
  batch = batch_of(rollouts, "portool")
  gid, valid = np.asarray(rollouts.group_id), np.asarray(rollouts.row_valid)
  opts = MODES["seq_mean_token_mean"]
  want = run_step(shape, PADDED, opts, batch, gid, valid, minibatches=2)
  got = run_step(shape, dataclasses.replace(PACKED, max_tokens_per_microbatch=16), opts,
                 batch, gid, valid, minibatches=2)
  assert_same_step(got, want)


@pytest.fixture(scope="module")
def logprob_passes():
  graphdef, params, _, place, _ = ts.setup()
  return (params, train_steps.TokenLogprobs(graphdef, place, PADDED),
          train_steps.TokenLogprobs(graphdef, place, PACKED))


@settings(max_examples=15)
@given(strategies.tree_batches())
def test_packed_logprobs_equal_the_padded_ones(logprob_passes, r):
  params, padded, packed = logprob_passes
  want = np.asarray(padded(params, r.tokens, r.token_valid))
  got = np.asarray(packed(params, r.tokens, r.token_valid, r.group_id))
  np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL)
  assert np.all(got[~np.asarray(r.token_valid)] == 0)


def test_reference_and_old_logprob_passes_fill_the_generated_tokens(rollouts, logprob_passes):
  """`with_policy_logprobs` / `with_reference_logprobs` on the packed path: the groups' rows
  packed up to their last generated token, log-probs of the generated tokens (where the
  samplers' `old_logprobs` live; the loss reads nothing else), 0 elsewhere."""
  params, padded, packed = logprob_passes
  with pytest.raises(ValueError, match="group_id: the packed log-prob pass"):
    packed(params, rollouts.tokens, rollouts.token_valid)
  got = np.asarray(train_steps.with_policy_logprobs(rollouts, packed, params).old_logprobs)
  want = np.asarray(padded(params, rollouts.tokens, rollouts.token_valid))
  generated = np.asarray(rollouts.loss_mask)
  np.testing.assert_allclose(got[generated], want[generated], rtol=TOL, atol=TOL)
  assert np.all(got[~generated] == 0) and np.all(want[generated] != 0)


def test_a_run_compiles_a_handful_of_executables():
  """Twelve steps of ragged batches (every row's length and every group's prompt drawn
  anew), each a log-prob pass and 2 mini-batch updates: the packed shapes fall on few
  buckets."""
  graphdef, params, tx, place, state = ts.setup()
  opts = dataclasses.replace(PACKED, max_tokens_per_microbatch=256)
  step = train_steps.policy_step(graphdef, tx, place, MODES["seq_mean_token_mean"], opts)
  passes = train_steps.TokenLogprobs(graphdef, place, opts)
  with compiled_functions() as compiled:
    for i in range(12):
      rng = np.random.default_rng(100 + i)
      r = synthetic.independent_rollouts(rng, [4] * 4, max_depth=4, finish_prob=0.4,
                                         prompt_tokens=int(rng.integers(8, 16)), step_tokens=4,
                                         response_tokens=3, vocab_size=ts.VOCAB)
      r = train_steps.with_policy_logprobs(r, passes, state.params)
      state, _ = update_passes(state, step, batch_of(r, "grpo"), np.asarray(r.group_id),
                               np.asarray(r.row_valid), 2, 1, seed=0, step=i)
  counts = {name: compiled.count(name) for name in set(compiled)}
  print(f"\ncompilations over 12 steps: {counts}")
  # The update's shapes only grow (`Packer.ratchet`): one compilation here, where each step's
  # own buckets compiled 5. The pass also compiles per micro-batch count (the 256-token
  # budget takes 1-3 here; `make run`'s 16,384 takes 1).
  assert counts["jit(step)"] <= 2 and counts["jit(logprobs)"] <= 4


def test_the_packed_shapes_only_grow_but_the_micro_batch_count():
  """`Packer.ratchet`: each size at least the largest used so far, the micro-batch count as
  the batch needs (a larger one would compute whole empty sequences)."""
  from tirjax.train_steps.packing import Shapes  # noqa: PLC0415
  graphdef, _, _, place, _ = ts.setup()
  packer = train_steps.TokenLogprobs(graphdef, place, PACKED).packed.packer
  big = Shapes(microbatches=3, shards=1, length=256, rows=8, row_length=128, keys=72,
               targets=192, block=8)
  small = Shapes(microbatches=1, shards=1, length=64, rows=16, row_length=64, keys=80,
                 targets=64, block=8)
  assert packer.ratchet(big) == big
  assert packer.ratchet(small) == Shapes(microbatches=1, shards=1, length=256, rows=16,
                                         row_length=128, keys=80, targets=192, block=8)
  assert packer.high.rows == 16 and packer.ratchet(big).microbatches == 3


def test_the_packed_shapes_resume_from_what_was_saved():
  """`Packer.saved`/`resume` (issue 52): a packer resumed from another's saved sizes ratchets as
  that packer would (so a resumed run pads as the uninterrupted one), and sizes saved for
  another layout (batch shards, attention block) or not sizes at all are refused by name."""
  from tirjax.train_steps.packing import Shapes  # noqa: PLC0415
  graphdef, _, _, place, _ = ts.setup()
  make = lambda: train_steps.TokenLogprobs(graphdef, place, PACKED).packer
  first, resumed = make(), make()
  assert first.saved() is None
  big = Shapes(microbatches=3, shards=1, length=256, rows=8, row_length=128, keys=72,
               targets=192, block=8)
  small = Shapes(microbatches=1, shards=1, length=64, rows=16, row_length=64, keys=80,
                 targets=64, block=8)
  first.ratchet(big)
  saved = json.loads(json.dumps(first.saved()))  # as a checkpoint's metadata holds it
  resumed.resume(saved)
  assert resumed.ratchet(small) == first.ratchet(small) != small
  fresh = make()
  fresh.resume(None)
  assert fresh.ratchet(small) == small  # nothing saved: a fresh start
  for bad, what in [([1, 2, 3], "expected 8 sizes"), ("big", "expected 8 sizes"),
                    ([3, 2, 256, 8, 128, 72, 192, 8], "2 batch shards"),
                    ([3, 1, 256, 8, 128, 72, 192, 16], "attention block 16"),
                    ([3, 1, 256.0, 8, 128, 72, 192, 8], "expected 8 sizes")]:
    with pytest.raises(ValueError, match=what):
      make().resume(bad)
