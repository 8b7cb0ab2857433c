"""The built-in JAX sampler: raw log-probs and entropies against teacher forcing, greedy
decoding against the full forward, seeds, top-p, per-row stops, buckets, weight updates.

One tiny model and one sampler serve the whole module (each bucket compiles once); the model's
weights are scaled up (`init_std=0.5`) so that its next-token distributions are peaked and
differ from position to position.
"""

import dataclasses
import collections

import hypothesis
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from flax import nnx
from hypothesis import strategies as st

from tirjax.testing.reference.sampling import kept_margin, nucleus_distribution
from tirjax.models import config, decoder
from tirjax.models.logprobs import token_logprobs
from tirjax.sampling.choice import choose, nucleus
from tirjax.sampling.interface import SamplingParams
from tirjax.sampling.jax_sampler import Bucket, JaxSampler, JaxSamplerOptions, bucket

# One worker builds the module's model and compiled buckets (make test: --dist loadgroup).
pytestmark = [pytest.mark.xdist_group("jax_sampler"), pytest.mark.slow]

V = 128
OPTIONS = JaxSamplerOptions(min_batch=8, max_batch=16, min_prompt_len=16, min_new_tokens=16,
                            max_top_logprobs=4)


@pytest.fixture(scope="module")
def model():
  return decoder.init(config.tiny(vocab_size=V, init_std=0.5), seed=0)


@pytest.fixture(scope="module")
def sampler(model):
  return JaxSampler(model, OPTIONS, policy_version=2)


@pytest.fixture(scope="module")
def prompts():
  rng = np.random.default_rng(0)
  return [rng.integers(0, V, size=n).tolist() for n in (3, 16, 1, 9)]


@nnx.jit
def _teacher(model, tokens, valid):
  logp, entropy = token_logprobs(model, tokens, valid, chunk_size=64, with_entropy=True)
  return logp, entropy, jax.nn.log_softmax(model(tokens, valid), axis=-1)


def teacher(model, prompt, sample):
  """Teacher-forced (log-probs, entropies, full log-softmax rows) of the sampled tokens."""
  row = np.zeros((1, 48), np.int32)
  ids = prompt + sample.tokens
  row[0, :len(ids)] = ids
  valid = np.arange(48)[None] < len(ids)
  logp, entropy, full = (np.asarray(x[0]) for x in _teacher(model, row, valid))
  span = slice(len(prompt), len(ids))
  return logp[span], entropy[span], full[len(prompt) - 1:len(ids) - 1]


def test_bucket_policy():
  assert [bucket(n, 8) for n in (1, 8, 9, 16, 17, 100)] == [8, 8, 16, 16, 32, 128]
  assert bucket(0, 1) == 1 and bucket(1, 1) == 1 and bucket(3, 1) == 4


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_logprobs_and_entropies_are_the_raw_models(model, sampler, prompts, temperature, top_p):
  """Whatever the temperature and top-p, the reported log-probs and entropies are the raw
  model's (temperature 1, no top-p), as `token_logprobs` computes them by teacher forcing."""
  params = SamplingParams(n=2, temperature=temperature, top_p=top_p, max_new_tokens=12, seed=3)
  out = sampler.generate(prompts, params)
  assert [len(g) for g in out] == [2] * len(prompts)
  for prompt, group in zip(prompts, out):
    for s in group:
      assert s.finish_reason == "length" and len(s.tokens) == 12 and s.policy_version == 2
      assert all(0 <= t < V for t in s.tokens) and s.top_logprobs is None
      logp, entropy, _ = teacher(model, prompt, s)
      np.testing.assert_allclose(s.logprobs, logp, atol=1e-4, rtol=0)
      np.testing.assert_allclose(s.entropies, entropy, atol=1e-4, rtol=0)
  # The samples are not all the most likely tokens: the distributions are really sampled.
  assert np.mean([lp for g in out for s in g for lp in s.logprobs]) < -0.3


@pytest.mark.parametrize("temperature, top_p", [(0.6, 1.0), (0.7, 0.9)])
def test_logprob_temperature_reports_the_tempered_policys_logprobs(model, sampler, prompts,
                                                                    temperature, top_p):
  """With `logprob_temperature` = T the log-probs are log softmax(z / T) of the sampled
  tokens, z the teacher-forced logits (the tempered policy that `train.tempered_policy`
  trains; top-p not applied); the same seed draws the same tokens, and the entropies stay the
  raw model's."""
  params = SamplingParams(n=2, temperature=temperature, top_p=top_p, max_new_tokens=12, seed=3)
  raw = sampler.generate(prompts, params)
  tempered = sampler.generate(
      prompts, dataclasses.replace(params, logprob_temperature=temperature))
  for prompt, group, raw_group in zip(prompts, tempered, raw):
    for s, r in zip(group, raw_group):
      assert s.tokens == r.tokens
      _, entropy, full = teacher(model, prompt, s)  # raw log-softmax rows: z up to a constant
      reference = jax.nn.log_softmax(full / temperature, axis=-1)
      logp = np.take_along_axis(np.asarray(reference), np.asarray(s.tokens)[:, None], -1)[:, 0]
      np.testing.assert_allclose(s.logprobs, logp, atol=1e-4, rtol=0)
      np.testing.assert_allclose(s.entropies, entropy, atol=1e-4, rtol=0)
      assert np.max(np.abs(np.asarray(s.logprobs) - r.logprobs)) > 1e-2  # not the raw ones
  with pytest.raises(ValueError, match="logprob_temperature"):
    SamplingParams(logprob_temperature=0.0)


def test_top_logprobs_are_the_most_likely_tokens(model, sampler, prompts):
  out = sampler.generate(prompts, SamplingParams(max_new_tokens=5, seed=4, top_logprobs=3))
  for prompt, (s,) in zip(prompts, out):
    _, _, full = teacher(model, prompt, s)
    assert len(s.top_logprobs) == len(s.tokens)
    for top, row in zip(s.top_logprobs, full):
      want = np.argsort(-row)[:3]
      assert list(top) == want.tolist()
      np.testing.assert_allclose(list(top.values()), row[want], atol=1e-4)


def test_temperature_zero_is_argmax_of_the_full_forward(model, sampler, prompts):
  out = sampler.generate(prompts, SamplingParams(n=2, temperature=0.0, max_new_tokens=12))
  for prompt, (a, b) in zip(prompts, out):
    assert a.tokens == b.tokens
    _, _, full = teacher(model, prompt, a)
    for t, row in zip(a.tokens, full):
      top2 = np.sort(row)[-2:]
      assert row[t] >= top2[1] - 1e-5  # the chosen token is a maximiser ...
      if top2[1] - top2[0] > 1e-4:  # ... and the argmax wherever that is unambiguous
        assert t == int(np.argmax(row))


def test_tiny_top_p_keeps_only_the_most_likely_token(sampler, prompts):
  greedy = sampler.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=8))
  nucleus_of_one = sampler.generate(prompts, SamplingParams(top_p=1e-6, max_new_tokens=8))
  assert [g[0].tokens for g in greedy] == [g[0].tokens for g in nucleus_of_one]


def test_a_seed_reproduces_a_batch(sampler, prompts):
  params = SamplingParams(n=2, max_new_tokens=10, seed=11)
  first = sampler.generate(prompts, params)
  replay = sampler.generate(prompts, params)
  other_seed = sampler.generate(prompts, SamplingParams(n=2, max_new_tokens=10, seed=12))

  def ids(out):
    return [s.tokens for g in out for s in g]

  assert ids(first) == ids(replay)
  assert [s.logprobs for g in first for s in g] == [s.logprobs for g in replay for s in g]
  assert ids(first) != ids(other_seed)
  assert first[0][0].tokens != first[0][1].tokens  # the n samples of a prompt differ


def test_stops_end_each_row_at_its_first_stop_token(sampler, prompts):
  """Rows replayed with a stop token: a row that contains it ends there (keeping it, finish
  "stop"), the other rows are unchanged (finish "length")."""
  many = prompts + [p[::-1] for p in prompts]
  params = SamplingParams(max_new_tokens=16, seed=5)
  free = [g[0] for g in sampler.generate(many, params)]
  counts = collections.Counter(t for s in free for t in set(s.tokens[1:]))
  stop = max((t for t, c in counts.items() if c < len(many)), key=counts.get)
  stopped = [g[0] for g in sampler.generate(
      many, SamplingParams(max_new_tokens=16, seed=5, stop_token_ids=(stop, V - 1)))]
  reasons = set()
  for a, b in zip(free, stopped):
    hits = [i for i, t in enumerate(a.tokens) if t in (stop, V - 1)]
    end = hits[0] + 1 if hits else len(a.tokens)
    assert b.tokens == a.tokens[:end] and b.logprobs == a.logprobs[:end]
    assert b.finish_reason == ("stop" if hits else "length")
    reasons.add(b.finish_reason)
  assert reasons == {"stop", "length"}


def test_one_compile_per_bucket(sampler):
  """Calls of any size within a bucket reuse its executable; rows beyond `max_batch` run in
  chunks; the n samples of a prompt share its prefill; `top_logprobs` is part of the bucket."""
  rng = np.random.default_rng(1)

  def call(prompts, length, new, top=0, n=1):
    ps = [rng.integers(0, V, size=rng.integers(1, length + 1)).tolist() for _ in range(prompts)]
    ps[0] = ps[0] + [1] * (length - len(ps[0]))  # the longest prompt has `length` tokens
    out = sampler.generate(ps, SamplingParams(n=n, max_new_tokens=new, top_logprobs=top))
    assert [[len(s.tokens) for s in g] for g in out] == [[new] * n] * prompts

  before = set(sampler.compiled_buckets)
  calls = [(3, 16, 16), (8, 5, 7), (1, 16, 1), (9, 12, 16), (16, 16, 9), (20, 16, 16),
           (2, 17, 16), (5, 32, 3), (4, 3, 17), (2, 16, 16, 2), (3, 16, 16, 0, 5),
           (1, 4, 16, 0, 8), (4, 16, 16, 0, 5)]
  compiles = []

  def listen(event, _seconds, **_):
    if event == "/jax/core/compile/backend_compile_duration":
      compiles.append(event)

  jax.monitoring.register_event_duration_secs_listener(listen)
  try:
    for c in calls:
      call(*c)
    first = len(compiles)
    for c in calls:
      call(*c)
  finally:
    jax.monitoring.unregister_event_duration_listener(listen)
  assert first >= len(set(sampler.compiled_buckets) - before)
  assert len(compiles) == first  # the second round compiles nothing at all
  expected = {Bucket(8, 8, 16, 16, 0), Bucket(16, 16, 16, 16, 0), Bucket(8, 8, 32, 16, 0),
              Bucket(8, 8, 16, 32, 0), Bucket(8, 8, 16, 16, 4), Bucket(16, 8, 16, 16, 0)}
  assert sampler.precompile(20, 3, 16) == Bucket(16, 16, 16, 16, 0)  # compiled already
  assert sampler.bucket_for(12, 3, 16, prompts=6) == Bucket(16, 8, 16, 16, 0)
  assert expected <= set(sampler.compiled_buckets)
  assert set(sampler.compiled_buckets) - before <= expected
  assert len(sampler.compiled_buckets) == len(set(sampler.compiled_buckets))


def test_update_swaps_weights_without_recompiling(model, sampler, prompts):
  other = decoder.init(model.config, seed=1)
  params = SamplingParams(max_new_tokens=8, seed=2)
  before = sampler.generate(prompts, params)
  buckets = sampler.compiled_buckets
  try:
    sampler.update(other, policy_version=7)
    out = sampler.generate(prompts, params)
    assert [g[0].logprobs for g in out] != [g[0].logprobs for g in before]
    assert sampler.compiled_buckets == buckets
    for prompt, (s,) in zip(prompts, out):
      assert s.policy_version == 7
      np.testing.assert_allclose(s.logprobs, teacher(other, prompt, s)[0], atol=1e-4, rtol=0)
    bigger = decoder.init(config.tiny(vocab_size=V + 1))
    with pytest.raises(ValueError, match="vocab_size=129 \\(sampler: 128\\)"):
      sampler.update(bigger, 8)
    with pytest.raises(ValueError, match="rope_theta"):
      sampler.update(decoder.init(model.config.replace(rope_theta=1e4)), 8)
    with pytest.raises(ValueError, match="parameter .*embed.* is float32\\[129, 64\\]"):
      sampler.update(nnx.state(bigger), 8)
    with pytest.raises(ValueError, match="structure"):  # qwen2 has biases, qwen3 q/k norms
      sampler.update(nnx.state(decoder.init(config.tiny(vocab_size=V, family="qwen2"))), 8)
    assert sampler.policy_version == 7
  finally:
    sampler.update(nnx.state(model), policy_version=2)
  assert sampler.generate(prompts[:1], params)[0][0].policy_version == 2


def test_short_and_edge_requests(sampler):
  out = sampler.generate([[5]], SamplingParams(n=3, max_new_tokens=1, seed=1))
  assert [len(s.tokens) for s in out[0]] == [1, 1, 1]
  assert sampler.generate([], SamplingParams()) == []


@pytest.mark.parametrize("prompts, params, match", [
    ([[]], SamplingParams(), "prompts\\[0\\]: empty"),
    ([[1, V]], SamplingParams(), "prompts\\[0\\]: token ids"),
    ([[-1]], SamplingParams(), "prompts\\[0\\]: token ids"),
    ([[1]], SamplingParams(stop_token_ids=(V,)), "stop_token_ids"),
    ([[1]], SamplingParams(stop_token_ids=tuple(range(9))), "max_stop_tokens"),
    ([[1]], SamplingParams(top_logprobs=5), "max_top_logprobs"),
])
def test_bad_requests_are_named(sampler, prompts, params, match):
  with pytest.raises(ValueError, match=match):
    sampler.generate(prompts, params)


@pytest.mark.parametrize("changes, match", [
    (dict(min_batch=6), "min_batch"), (dict(max_batch=4), "max_batch"),
    (dict(min_prompt_len=0), "min_prompt_len"), (dict(min_new_tokens=3), "min_new_tokens"),
    (dict(max_stop_tokens=0), "max_stop_tokens"), (dict(max_top_logprobs=0), "max_top_logprobs"),
])
def test_bad_options_are_named(changes, match):
  with pytest.raises(ValueError, match=match):
    JaxSamplerOptions(**changes)


# -- token choice ----------------------------------------------------------------------------

_nucleus = jax.jit(nucleus)
_choose = jax.jit(choose)


@hypothesis.given(st.lists(st.floats(-8, 8, width=32, allow_subnormal=False), min_size=1,
                           max_size=12),
                  st.floats(1e-3, 1.0), st.sampled_from([0.5, 1.0, 2.0]))
def test_nucleus_keeps_the_reference_set(logits, top_p, temperature):
  hypothesis.assume(kept_margin(logits, top_p, temperature) > 1e-4)
  z = np.asarray(logits, np.float32)
  got = np.asarray(_nucleus(jnp.asarray(z / np.float32(temperature))[None], top_p))[0]
  want = nucleus_distribution(z, top_p, temperature)
  kept = set(np.flatnonzero(np.isfinite(got)).tolist())
  # Tokens tied with the last kept one are kept too.
  tie = min(z[v] for v in want)
  assert kept == set(want) | {v for v in range(len(z)) if z[v] == tie}
  assert np.all(got[list(kept)] == z[list(kept)] / np.float32(temperature))


@pytest.mark.parametrize("temperature, top_p", [(1.0, 0.75), (2.0, 0.75), (0.5, 1.0)])
def test_draws_follow_the_nucleus_distribution(temperature, top_p):
  """20,000 draws from p = (0.5, 0.3, 0.15, 0.05): chi-square against the reference
  distribution; tokens outside the nucleus are never drawn."""
  logits = np.log([0.5, 0.3, 0.15, 0.05]).astype(np.float32)
  rows = 20_000
  draws = np.asarray(_choose(jax.random.key(0), jnp.tile(logits, (rows, 1)),
                             jnp.float32(temperature), jnp.float32(top_p)))
  want = nucleus_distribution(logits, top_p, temperature)
  counts = np.bincount(draws, minlength=4)
  assert set(np.flatnonzero(counts)) == set(want)
  expected = np.array([want[v] * rows for v in sorted(want)])
  assert scipy.stats.chisquare(counts[sorted(want)], expected).pvalue > 1e-3


# XLA on CPU flushes subnormal floats to zero, so logits are drawn without them.
@hypothesis.given(st.lists(st.floats(-30, 30, width=32, allow_subnormal=False), min_size=8,
                           max_size=8),
                  st.floats(1e-3, 1.0), st.sampled_from([0.0, 0.3, 1.0, 3.0]),
                  st.integers(0, 2**31 - 1))
def test_every_choice_lies_in_the_nucleus(logits, top_p, temperature, seed):
  """Any logits (ties, wide ranges) and key: greedy picks a maximiser; a draw picks a token
  of the reference nucleus (or one tied with its least likely member)."""
  z = np.asarray(logits, np.float32)
  tok = int(_choose(jax.random.key(seed), jnp.asarray(z)[None], jnp.float32(temperature),
                    jnp.float32(top_p))[0])
  if temperature == 0:
    assert z[tok] == z.max()
    return
  hypothesis.assume(kept_margin(z, top_p, temperature) > 1e-4)
  want = nucleus_distribution(z, top_p, temperature)
  assert tok in want or z[tok] == min(z[v] for v in want)


def test_stopped_rows_move_out_without_changing_any_sample(model):
  """Issue 20: once the rows still going fit in half their bucket they continue in a smaller
  one; each row draws from its own stream, so every sample is the one it would have been
  (against a sampler that never moves rows)."""
  rng = np.random.default_rng(3)
  ps = [rng.integers(0, V, size=int(rng.integers(1, 12))).tolist() for _ in range(16)]
  params = SamplingParams(n=1, temperature=1.0, max_new_tokens=32, stop_token_ids=(5, 9, 17),
                          seed=11, top_logprobs=2)
  fixed = JaxSampler(model, dataclasses.replace(OPTIONS, min_decode_rows=16, decode_segment=4))
  moving = JaxSampler(model, dataclasses.replace(OPTIONS, min_decode_rows=1, decode_segment=4))
  want, got = fixed.generate(ps, params), moving.generate(ps, params)
  lengths = [len(g[0].tokens) for g in got]
  assert min(lengths) < 8 and max(lengths) > 16  # rows stop at very different steps
  assert any(k[0] == "take" for k in moving._decoders)  # rows did move
  assert not any(k[0] == "take" for k in fixed._decoders)
  for (a,), (b,) in zip(want, got):
    assert a.tokens == b.tokens and a.finish_reason == b.finish_reason
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-6, rtol=0)
    assert [sorted(d) for d in a.top_logprobs] == [sorted(d) for d in b.top_logprobs]


def test_sleep_keeps_the_sampler_usable_and_close_releases_it(model, prompts):
  """`sleep` only empties the caches until the next call; `close` ends the sampler."""
  s = JaxSampler(model, OPTIONS)
  params = SamplingParams(n=1, max_new_tokens=3, temperature=0.0, seed=0)
  before = s.generate(prompts[:1], params)
  s.sleep()
  assert s.generate(prompts[:1], params)[0][0].tokens == before[0][0].tokens
  s.close()
  assert not s.compiled_buckets
  with pytest.raises(RuntimeError, match="generate: this JaxSampler was closed"):
    s.generate(prompts[:1], params)
  with pytest.raises(RuntimeError, match="update: this JaxSampler was closed"):
    s.update(model, 1)
