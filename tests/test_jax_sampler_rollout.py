"""End to end: the `tiny` model (random weights) with the toolworld tokenizer, sampled by the
JAX sampler through `tirjax.episodes.rollout` (independent and tree modes), feeds every
registered estimator; the stored log-probs are the model's teacher-forced ones.

Buckets are chosen so that both modes share one executable: 16 rows, 512 prompt tokens
(`shapes.max_tokens` = 512 bounds every context), 16 new tokens.
"""

import dataclasses

import numpy as np
import pytest
from flax import nnx

from tirjax import advantages
from tirjax.env import chat
from tirjax.env.toolworld import make_tasks
from tirjax.models import config, decoder
from tirjax.models.logprobs import token_logprobs
from tirjax.episodes import ArpoOptions, RolloutOptions, Shapes, TreeOptions, rollout
from tirjax.rollouts import validate
from tirjax.sampling.interface import SamplingParams
from tirjax.sampling.jax_sampler import Bucket, JaxSampler, JaxSamplerOptions
from tirjax.testing.estimator_checks import with_needed_fields

# One worker builds the module's model and compiled buckets (make test: --dist loadgroup).
pytestmark = [pytest.mark.xdist_group("jax_sampler_rollout"), pytest.mark.slow]

SHAPES = Shapes(num_rows=16, max_steps=3, max_calls=4, max_gt_calls=8, max_tokens=512,
                max_params=4)
OPTIONS = JaxSamplerOptions(min_batch=16, max_batch=16, min_prompt_len=512, min_new_tokens=16)


@pytest.fixture(scope="module")
def model(tokenizer):
  return decoder.init(config.tiny(vocab_size=len(tokenizer)), seed=0)


TASKS = dict(split="train", n=4, seed=3)


def mode_options(mode):
  return RolloutOptions(mode=mode, n=2, max_steps=3, max_new_tokens=16, seed=1,
                        tree=TreeOptions(branch_factor=2), shapes=SHAPES)


@pytest.fixture(scope="module")
def batches(model, tokenizer):
  sampler = JaxSampler(model, OPTIONS, policy_version=4)
  out = {}
  for mode in ("independent", "tree"):
    out[mode] = rollout(sampler, tokenizer, make_tasks(**TASKS), mode_options(mode))
  assert sampler.compiled_buckets == (Bucket(16, 16, 512, 16, 0),)
  return out


@pytest.mark.parametrize("mode", ["independent", "tree"])
def test_prefix_cache_changes_nothing_but_the_work(model, tokenizer, batches, mode):
  """Continuing the cached rows of the last call (issue 20) samples what re-prefilling every
  context does: the same tokens, log-probs equal to float32 rounding (XLA sums the two
  shapes in different orders, so equal bits are not promised), on ragged multi-turn rows and
  on tree rows that share prefixes; and computes only the tokens a row has not seen."""
  baseline = JaxSampler(model, dataclasses.replace(OPTIONS, reuse_cache=False),
                        policy_version=4)
  old = rollout(baseline, tokenizer, make_tasks(**TASKS), mode_options(mode))
  new = batches[mode]
  np.testing.assert_array_equal(new.rollouts.tokens, old.rollouts.tokens)
  np.testing.assert_array_equal(new.rollouts.loss_mask, old.rollouts.loss_mask)
  mask = np.asarray(new.rollouts.loss_mask)
  gap = np.abs(np.asarray(new.rollouts.old_logprobs) - np.asarray(old.rollouts.old_logprobs))
  assert gap[mask].max() <= 1e-5
  valid = np.asarray(new.rollouts.row_valid)
  lengths = np.asarray(new.rollouts.token_valid).sum(axis=1)[valid]
  assert np.asarray(new.rollouts.num_steps)[valid].min() >= 2  # multi-turn
  if mode == "independent":
    assert lengths.min() < lengths.max()  # ragged
  else:  # rows that share a prefix: the tree's nodes carried by several rows
    nodes = np.asarray(new.rollouts.node_id)[np.asarray(new.rollouts.step_valid)]
    assert np.unique(nodes).size < nodes.size
  # Every call after the first continues cached rows: far fewer prompt tokens computed.
  assert new.stats["continued_rows"] > 0 and old.stats["continued_rows"] == 0
  assert new.stats["prefill_tokens"] < 0.5 * old.stats["prefill_tokens"]
  assert new.stats["sampled_tokens"] == old.stats["sampled_tokens"]


def test_new_weights_drop_the_prefix_cache(model, tokenizer):
  sampler = JaxSampler(model, OPTIONS)
  prompt = [5, 6, 7]
  (first,), = sampler.generate([prompt], SamplingParams(max_new_tokens=4, seed=0))
  more = prompt + first.tokens + [8, 9]
  sampler.generate([more], SamplingParams(max_new_tokens=4, seed=1))
  assert sampler.counters["continued_rows"] == 1
  sampler.update(nnx.state(model), policy_version=1)
  sampler.generate([more], SamplingParams(max_new_tokens=4, seed=1))
  assert sampler.counters["continued_rows"] == 1 and sampler.counters["prefilled_rows"] == 2


@pytest.mark.parametrize("mode", ["independent", "tree"])
def test_rollouts_are_valid_and_carry_the_models_logprobs(model, tokenizer, batches, mode):
  batch = batches[mode]
  r = batch.rollouts
  validate(r)
  valid = np.asarray(r.row_valid)
  assert valid.sum() == 8 and len(batch.episodes) == 8
  assert (np.asarray(r.policy_version)[valid] == 4).all()
  assert batch.stats["sampled_tokens"] > 0
  mask = np.asarray(r.loss_mask)
  assert mask.any()
  want, _ = nnx.jit(lambda m, t, v: token_logprobs(m, t, v, chunk_size=256))(
      model, r.tokens, r.token_valid)
  np.testing.assert_allclose(np.asarray(r.old_logprobs)[mask], np.asarray(want)[mask],
                             atol=1e-4, rtol=0)
  stops = set(chat.stop_token_ids(tokenizer))
  tokens, steps = np.asarray(r.tokens), np.asarray(r.token_step)
  for b in np.flatnonzero(valid):  # each step: at most 16 tokens, a stop token only last
    for t in range(int(r.num_steps[b])):
      ids = tokens[b, steps[b] == t].tolist()
      assert 1 <= len(ids) <= 16 and not stops & set(ids[:-1])


@pytest.mark.parametrize("name", advantages.names())
def test_every_registered_estimator_runs(batches, name):
  est = advantages.get(name)
  for mode, batch in batches.items():
    r = with_needed_fields(est, batch.rollouts)
    out = est(r)
    tokens = np.asarray(out.tokens)
    assert tokens.shape == r.tokens.shape and np.isfinite(tokens).all(), (name, mode)
    assert not tokens[~np.asarray(r.loss_mask)].any(), (name, mode)
    assert np.isfinite(np.asarray(out.steps)).all() and np.isfinite(np.asarray(out.rows)).all()


@pytest.mark.parametrize("mode", ["independent", "tree", "arpo"])
def test_a_share_of_the_queries_samples_the_rows_the_whole_batch_does(model, tokenizer, batches,
                                                                     mode):
  """Issue 18: one process of two samples queries 2-3 of the step (`first_query=2`) with its
  own sampler; its rows are the whole batch's rows of those queries, token for token (each
  row draws from a stream named by its query's batch-wide index, not by where the row sits in
  a sampler call, which differs between the two; a tree's choices likewise)."""
  tasks = make_tasks(**TASKS)
  options = mode_options(mode)
  if mode == "arpo":  # ARPO's branching: entropies, random branch counts, restarts
    options = dataclasses.replace(options, arpo=ArpoOptions(initial_rollouts=2,
                                                            total_rollouts=4, top_logprobs=4))
    whole = rollout(JaxSampler(model, OPTIONS, policy_version=4), tokenizer, tasks,
                    options).rollouts
  else:
    whole = batches[mode].rollouts
  share = rollout(JaxSampler(model, OPTIONS, policy_version=4), tokenizer, tasks[2:], options,
                  first_query=2).rollouts
  groups = np.asarray(whole.group_id)
  rows = np.flatnonzero(np.asarray(whole.row_valid) & (groups >= 2))
  mine = np.flatnonzero(np.asarray(share.row_valid))
  assert len(rows) == len(mine) >= 4
  np.testing.assert_array_equal(np.asarray(share.tokens)[mine], np.asarray(whole.tokens)[rows])
  np.testing.assert_array_equal(np.asarray(share.outcome)[mine], np.asarray(whole.outcome)[rows])


def test_a_prompt_draws_the_same_samples_wherever_it_is_in_a_call(model):
  sampler = JaxSampler(model, OPTIONS)
  prompts = [[5, 6, 7], [9, 10], [11, 12, 13, 14]]
  params = SamplingParams(n=2, max_new_tokens=8, seed=3, row_ids=(40, 41, 42))
  together = sampler.generate(prompts, params)
  alone = sampler.generate([prompts[2], prompts[0]],
                           dataclasses.replace(params, row_ids=(42, 40)))
  for got, want in ((alone[0], together[2]), (alone[1], together[0])):
    assert [s.tokens for s in got] == [s.tokens for s in want]
  assert together[0][0].tokens != together[0][1].tokens or together[1][0].tokens != \
      together[1][1].tokens  # the n samples of a prompt are not copies
