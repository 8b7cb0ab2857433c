"""End to end: the `tiny` model (random weights) with the toolworld tokenizer, sampled by the
JAX sampler through `tirjax.rollout.rollout` (independent and tree modes), feeds every
registered estimator; the stored log-probs are the model's teacher-forced ones.

Buckets are chosen so that both modes share one executable: 16 rows, 512 prompt tokens
(`shapes.max_tokens` = 512 bounds every context), 16 new tokens.
"""

import numpy as np
import pytest
import transformers
from flax import nnx

from tirjax import advantages
from tirjax.env import chat
from tirjax.env.toolworld import build_tokenizer, make_tasks
from tirjax.models import config, decoder
from tirjax.models.logprobs import token_logprobs
from tirjax.rollout import RolloutOptions, Shapes, TreeOptions, rollout
from tirjax.rollouts import validate
from tirjax.sampling.jax_sampler import Bucket, JaxSampler, JaxSamplerOptions

# One worker builds the module's model and compiled buckets (make test: --dist loadgroup).
pytestmark = pytest.mark.xdist_group("jax_sampler_rollout")

SHAPES = Shapes(num_rows=16, max_steps=3, max_calls=4, max_gt_calls=8, max_tokens=512,
                max_params=4)
OPTIONS = JaxSamplerOptions(min_batch=16, max_batch=16, min_prompt_len=512, min_new_tokens=16)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  path = build_tokenizer(tmp_path_factory.getbasetemp() / "toolworld_tokenizer")
  return transformers.AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="module")
def model(tokenizer):
  return decoder.init(config.tiny(vocab_size=len(tokenizer)), seed=0)


@pytest.fixture(scope="module")
def batches(model, tokenizer):
  sampler = JaxSampler(model, OPTIONS, policy_version=4)
  tasks = make_tasks("train", 4, seed=3)
  out = {}
  for mode in ("independent", "tree"):
    opts = RolloutOptions(mode=mode, n=2, max_steps=3, max_new_tokens=16, seed=1,
                          tree=TreeOptions(branch_factor=2), shapes=SHAPES)
    out[mode] = rollout(sampler, tokenizer, tasks, opts)
  assert sampler.compiled_buckets == (Bucket(16, 16, 512, 16, 0),)
  return out


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
    r = batch.rollouts
    out = est(r)
    tokens = np.asarray(out.tokens)
    assert tokens.shape == r.tokens.shape and np.isfinite(tokens).all(), (name, mode)
    assert not tokens[~np.asarray(r.loss_mask)].any(), (name, mode)
    assert np.isfinite(np.asarray(out.steps)).all() and np.isfinite(np.asarray(out.rows)).all()
