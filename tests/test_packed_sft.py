"""The packed SFT step equals the padded one (issue 38): demonstrations that share a system
prompt, first turns and a whole row, packed as forests; the same loss and gradients (1e-5
relative) under every aggregation mode, with micro-batches by a small token budget, on one
device and on the 8 simulated devices; fewer tokens forwarded; and the forests' grouping."""

import dataclasses

import jax
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tirjax import train_steps
from tirjax.testing import train_setup as ts
from tirjax.testing.compile_counts import compiled_functions
from tirjax.testing.reference import train_step as ref
from tirjax.train_steps import packed_sft

PADDED = train_steps.StepOptions(logprob_chunk_size=32)
PACKED = dataclasses.replace(PADDED, packed=True, attention_block=8,
                             max_tokens_per_microbatch=32)
TOL = 1e-5
SFT_MODES = {m: train_steps.SFTLossOptions(aggregation=m, norm_constant=7.0)
             for m in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm",
                       "seq_mean_token_sum")}


def one_step(setup, sft_opts, opts, batch):
  graphdef, params, tx, place, _ = setup
  step = train_steps.sft_step(graphdef, tx, place, sft_opts, opts)
  state = train_steps.init_state(params, tx, place, jax.random.key(0))
  state, metrics = step(state, batch)
  return metrics, ref.flatten(state.opt_state[0].grads)


@pytest.fixture(scope="module", params=[(1, 1, 1), (2, 2, 2)], ids=["one_device", "mesh"])
def setup(request):
  return ts.setup(request.param)


@pytest.mark.parametrize("mode", sorted(SFT_MODES))
def test_packed_sft_equals_padded(setup, mode):
  batch = ts.demonstrations(np.random.default_rng(0))
  padded, want = one_step(setup, SFT_MODES[mode], PADDED, batch)
  packed, got = one_step(setup, SFT_MODES[mode], PACKED, batch)
  np.testing.assert_allclose(float(packed["loss"]), float(padded["loss"]), rtol=TOL)
  for a, b in zip(got, want, strict=True):
    np.testing.assert_allclose(a, b, rtol=TOL, atol=TOL * float(np.max(np.abs(b))))
  assert np.linalg.norm(np.concatenate([g.ravel() for g in want])) > 0.01
  for key in ("tokens/loss", "tokens/valid"):
    assert float(packed[key]) == float(padded[key]), key
  assert float(packed["tokens/forwarded"]) < float(padded["tokens/forwarded"])


def test_ragged_batches_compile_few_executables():
  """Batches of other widths and sharing reuse the packed step's executable once its shapes
  stop growing (`Packer.ratchet`); a budget that holds a batch, as a run's does (one
  micro-batch: their count is what the budget needs, not ratcheted)."""
  graphdef, params, tx, place, _ = ts.setup()
  step = train_steps.sft_step(graphdef, tx, place, train_steps.SFTLossOptions(),
                              dataclasses.replace(PACKED, max_tokens_per_microbatch=256))
  state = train_steps.init_state(params, tx, place, jax.random.key(0))
  rng = np.random.default_rng(3)
  with compiled_functions() as compiled:
    for length in (24, 20, 24, 16, 24, 20, 24, 24):
      state, _ = step(state, ts.demonstrations(rng, length=length, prefix=9))
  steps = [name for name in compiled if name == "jit(step)"]
  assert 1 <= len(steps) <= 3, compiled


def _trie_size(rows):
  size, last = 0, ()
  for s in rows:
    common = next((i for i, (a, b) in enumerate(zip(s, last)) if a != b), min(len(s), len(last)))
    size, last = size + len(s) - common, s
  return size


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=7), min_size=1, max_size=12),
       st.integers(1, 4), st.integers(1, 20))
def test_forest_groups(rows, runs, budget):
  """Groups are runs of the rows in lexicographic order, at least min(runs, rows) of them, and
  each group's trie fits the budget unless it is one row."""
  length = max(map(len, rows)) + 1
  tokens = np.full((len(rows), length), -1, np.int32)
  for r, s in enumerate(rows):
    tokens[r, :len(s)] = s
  lengths = np.array([len(s) for s in rows])
  group = packed_sft.forest_groups(tokens, lengths, runs, budget)
  order = sorted(range(len(rows)), key=lambda r: rows[r])
  ids = group[order]
  assert np.all(np.diff(ids) >= 0) and ids[0] == 0 and np.all(np.diff(ids) <= 1)
  assert ids[-1] + 1 >= min(runs, len(rows))
  for g in range(ids[-1] + 1):
    members = [rows[r] for r in order if group[r] == g]
    assert len(members) == 1 or _trie_size(members) <= budget


def test_host_target_mask_is_the_step_s():
  batch = ts.demonstrations(np.random.default_rng(1))
  np.testing.assert_array_equal(
      packed_sft.host_target_mask(batch.token_valid, batch.loss_mask),
      np.asarray(train_steps.sft.target_mask(batch.token_valid, batch.loss_mask)))
