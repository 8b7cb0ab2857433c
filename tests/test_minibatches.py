"""Several updates per rollout batch (spec §5.1): the mini-batch partition, one mini-batch as
the single update, M > 1 against a loop that applies the updates one at a time from the spec,
and the clip acting only once the policy has moved from the sampler's."""

import jax
import numpy as np
import pytest
from hypothesis import given, strategies as st
from flax import nnx

from tirjax.testing import train_setup as ts
from tirjax import loss, train_steps
from tirjax.testing.reference import model_logprobs
from tirjax.testing.reference import train_step as ref
from tirjax.train_steps.minibatches import combine_updates, minibatch_rows, update_passes

LOSS = loss.LossOptions(clip_high=0.28)
STEP = train_steps.StepOptions(num_microbatches=2, logprob_chunk_size=32)


# -- The partition ----------------------------------------------------------------------------


@st.composite
def layouts(draw):
  """Group ids and valid rows of a batch: Q groups of n rows (in shuffled row order), padding
  rows, M dividing Q and the rows."""
  num_mb = draw(st.sampled_from((1, 2, 3, 4)))
  queries = num_mb * draw(st.integers(1, 3))
  n = draw(st.integers(1, 4))
  per = -(-(queries * n) // num_mb) + draw(st.integers(0, 3))
  rows = per * num_mb
  group = np.full(rows, -1)
  group[:queries * n] = np.repeat(draw(st.permutations(range(100, 100 + queries))), n)
  order = np.asarray(draw(st.permutations(range(rows))))
  group = group[order]
  return group, group >= 0, num_mb, draw(st.integers(0, 2**31 - 1))


@given(layouts())
def test_minibatches_partition_the_batch_into_whole_groups(layout):
  group, valid, num_mb, seed = layout
  rows = minibatch_rows(group, valid, num_mb, np.random.default_rng(seed))
  assert rows.shape == (num_mb, len(group) // num_mb)
  np.testing.assert_array_equal(np.sort(rows.ravel()), np.arange(len(group)))  # each row once
  groups = np.unique(group[valid])
  seen = [set(group[r][valid[r]]) for r in rows]
  for g in groups:  # a group lies whole in one mini-batch
    assert sum(g in s for s in seen) == 1
    (home,) = [m for m, s in enumerate(seen) if g in s]
    assert set(np.flatnonzero(group == g)) <= set(rows[home])
  assert sorted(len(s) for s in seen) == sorted(len(p) for p in np.array_split(groups, num_mb))
  if num_mb == 1:
    np.testing.assert_array_equal(rows[0], np.arange(len(group)))  # nothing moves
  again = minibatch_rows(group, valid, num_mb, np.random.default_rng(seed))
  np.testing.assert_array_equal(rows, again)


def test_minibatch_shuffle_differs_between_passes():
  group = np.repeat(np.arange(8), 2)
  valid = np.ones(16, bool)
  passes = {tuple(minibatch_rows(group, valid, 4, np.random.default_rng([0, 3, e]))[0])
            for e in range(6)}
  assert len(passes) > 1


def test_minibatch_errors_name_the_problem():
  group, valid = np.repeat(np.arange(4), 2), np.ones(8, bool)
  with pytest.raises(ValueError, match="num_minibatches: 3 does not divide the batch of 8"):
    minibatch_rows(group, valid, 3, np.random.default_rng(0))
  ragged = np.array([0, 0, 0, 0, 0, 1, 2, 3])
  with pytest.raises(ValueError, match="groups of unequal size"):
    minibatch_rows(ragged, valid, 2, np.random.default_rng(0))


def test_combine_updates():
  ups = [{"loss": 1.0, "metrics/ratio/min": 0.9, "metrics/ratio/max": 1.1,
          "metrics/clip_frac_low": 0.0},
         {"loss": 3.0, "metrics/ratio/min": 0.5, "metrics/ratio/max": 1.0,
          "metrics/clip_frac_low": 0.25}]
  mean, last = combine_updates(ups)
  assert mean == {"loss": 2.0, "metrics/ratio/min": 0.5, "metrics/ratio/max": 1.1,
                  "metrics/clip_frac_low": 0.125}
  assert last == {"updates/count": 2.0, "updates/last/clip_frac_low": 0.25}
  with pytest.raises(ValueError, match="at least one update"):
    combine_updates([])


# -- Updates on a tiny model ------------------------------------------------------------------

QUERIES, N, PADDING = 4, 3, 4  # 12 valid rows in 4 groups, 4 padding rows: B = 16


@pytest.fixture(scope="module")
def model():
  return ts.setup((2, 1, 1))  # rows over 2 devices: a mini-batch gathers across them


def grouped_batch(rng, own_logprobs_of=None):
  """`ts.policy_batch` with groups: rows in shuffled order, padding rows out of the loss.
  `own_logprobs_of=(graphdef, params)`: old log-probs are that policy's (ρ = 1 at the start)."""
  batch = ts.policy_batch(rng, rows=QUERIES * N + PADDING)
  group = np.full(len(batch.row_mask), -1)
  group[:QUERIES * N] = np.repeat(np.arange(QUERIES), N)
  group = group[rng.permutation(len(group))]
  valid = group >= 0
  batch = batch.replace(row_mask=batch.row_mask & valid)
  if own_logprobs_of is not None:
    graphdef, params = own_logprobs_of
    m = nnx.merge(graphdef, params)
    logp, _ = model_logprobs.dense_logprobs(m.hidden(batch.tokens, batch.token_valid),
                                            m.unembedding, batch.tokens, batch.token_valid)
    batch = batch.replace(old_logprobs=np.where(batch.token_valid, np.asarray(logp), 0.0
                                                ).astype(np.float32))
  return batch, group, valid


def fresh(model, tx=None):
  graphdef, params, tx0, place, _ = model
  tx = tx0 if tx is None else tx
  place = train_steps.placement(params, tx, place.mesh)
  return train_steps.init_state(params, tx, place, jax.random.key(3)), place, tx


def test_one_minibatch_one_pass_is_the_single_update(model):
  """M = 1, E = 1: bit-identical to the step the trainer made before mini-batches."""
  graphdef = model[0]
  batch, group, valid = grouped_batch(np.random.default_rng(0))
  state, place, tx = fresh(model)
  step = train_steps.policy_step(graphdef, tx, place, LOSS, STEP)
  a, updates = update_passes(state, step, batch, group, valid, 1, 1, seed=0, step=0)
  state, _, _ = fresh(model)
  b, metrics = step(state, batch)
  assert len(updates) == 1 and float(updates[0]["loss"]) == float(metrics["loss"])
  for x, y in zip(ref.flatten(a.params), ref.flatten(b.params)):
    np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("num_mb, epochs", [(2, 1), (4, 2)])
def test_minibatch_updates_match_a_loop_of_single_updates(model, num_mb, epochs):
  """Each update equals the spec's: the full-batch objective of its groups' rows alone (its
  own aggregation denominators, no padding), AdamW applied one update at a time."""
  graphdef, params = model[0], model[1]
  batch, group, valid = grouped_batch(np.random.default_rng(1))
  state, place, tx = fresh(model, train_steps.make_optimizer(ts.OPTIMIZER))
  step = train_steps.policy_step(graphdef, tx, place, LOSS, STEP)
  new, updates = update_passes(state, step, batch, group, valid, num_mb, epochs, seed=5,
                               step=7)
  assert len(updates) == num_mb * epochs

  # The loop reference: the same partition (its properties are tested above), each
  # mini-batch's rows selected on the host, one plain gradient and AdamW update at a time.
  keys = ("learning_rate", "schedule", "warmup_steps", "decay_steps", "final_lr_fraction")
  opts = ts.OPTIMIZER
  p = [np.asarray(x) for x in ref.flatten(params)]
  treedef = jax.tree.structure(params)
  grads_seq, losses = [], []
  for epoch in range(epochs):
    parts = minibatch_rows(group, valid, num_mb, np.random.default_rng([5, 7, epoch]))
    for part in parts:
      mine = np.isin(group, group[part][valid[part]]) & valid
      sub = jax.tree.map(lambda x: np.asarray(x)[mine], batch)
      current = jax.tree.unflatten(treedef, [np.asarray(x, np.float32) for x in p])
      value, grads = jax.value_and_grad(
          lambda q: ref.full_batch_policy_objective(graphdef, q, sub, LOSS))(current)
      losses.append(float(value))
      grads_seq.append([np.asarray(g) for g in ref.flatten(grads)])
      lrs = [ref.schedule(i, **{k: getattr(opts, k) for k in keys}) for i in range(len(grads_seq))]
      p = ref.adamw_steps(ref.flatten(params), grads_seq, lrs=lrs, b1=opts.b1, b2=opts.b2,
                          eps=opts.eps, weight_decay=opts.weight_decay,
                          max_grad_norm=opts.max_grad_norm)[-1]
  np.testing.assert_allclose([float(u["loss"]) for u in updates], losses, rtol=2e-4, atol=1e-6)
  for got, want in zip(ref.flatten(new.params), p):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-6)


def test_clip_acts_only_after_the_first_update(model):
  """Old log-probs are the policy's own: the first update sees ρ = 1 (nothing clipped); a
  large learning rate then moves the ratio past ε on the next mini-batches."""
  graphdef, params = model[0], model[1]
  batch, group, valid = grouped_batch(np.random.default_rng(2), own_logprobs_of=model[:2])
  big = train_steps.OptimizerOptions(learning_rate=0.05, weight_decay=0.0, max_grad_norm=None)
  state, place, tx = fresh(model, train_steps.make_optimizer(big))
  step = train_steps.policy_step(graphdef, tx, place, LOSS, STEP)
  _, updates = update_passes(state, step, batch, group, valid, 4, 1, seed=0, step=0)
  clipped = [float(u["metrics/clip_frac_low"]) + float(u["metrics/clip_frac_high"])
             for u in updates]
  assert clipped[0] == 0.0
  # ρ = 1 up to the float error between the reference's dense and the step's chunked log-probs
  np.testing.assert_allclose(float(updates[0]["metrics/ratio/std"]), 0.0, atol=1e-3)
  assert max(clipped[1:]) > 0.0, clipped
  _, last = combine_updates(updates)
  assert last["updates/count"] == 4.0
