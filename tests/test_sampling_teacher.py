"""`DecoderTeacher`: tirjax's teacher-forced log-probs for hand-over checks, on padded shapes."""

import hypothesis
import hypothesis.strategies as st
import jax
import numpy as np
import pytest
import scipy.special
from flax import nnx

from tirjax.testing.compile_counts import count_traces
from tirjax.models import config, decoder
from tirjax.sampling.teacher import DecoderTeacher, padded_shape

V = 50


@pytest.fixture(scope="module")
def model():
  return decoder.init(config.tiny(vocab_size=V, init_std=0.3), seed=0)


def reference(model, seq):
  """log p(seq[t] | seq[:t]) from the model's logits of the unpadded sequence (entry 0: 0)."""
  logits = np.asarray(model(np.asarray([seq], np.int32))[0], np.float64)
  logp = scipy.special.log_softmax(logits, axis=-1)
  return np.concatenate([[0.0], logp[np.arange(len(seq) - 1), seq[1:]]])


def test_log_probs_of_ragged_sequences_equal_the_models_own(model):
  rng = np.random.default_rng(0)
  seqs = [rng.integers(0, V, size=n).tolist() for n in (1, 2, 40, 64)]
  teacher = DecoderTeacher.of(model, chunk_size=32)
  got = teacher(seqs)
  assert [len(g) for g in got] == [len(s) for s in seqs]
  for seq, g in zip(seqs, got):
    np.testing.assert_allclose(g, reference(model, seq), atol=1e-5, rtol=0)
  # Other lengths in the same padded shape reuse the executable.
  with count_traces() as traces:
    teacher([rng.integers(0, V, size=n).tolist() for n in (3, 50)])
  assert not traces


def test_new_params_change_the_log_probs_without_recompiling(model):
  graphdef, params = nnx.split(model)
  teacher = DecoderTeacher(graphdef, params, chunk_size=64)
  seq = list(range(1, 30))
  before = teacher([seq])[0]
  scaled = jax.tree.map(lambda x: 1.25 * x, params)
  teacher.set_params(scaled)
  with count_traces() as traces:
    after = teacher([seq])[0]
  np.testing.assert_allclose(after, reference(nnx.merge(graphdef, scaled), seq), atol=1e-4,
                             rtol=0)
  assert np.abs(np.subtract(after, before)).max() > 0.1
  assert not traces


@hypothesis.given(st.lists(st.integers(1, 3000), min_size=1, max_size=40))
def test_padded_shape_holds_the_batch_in_few_shapes(lengths):
  rows, width = padded_shape(lengths)
  assert rows % 8 == 0 and len(lengths) <= rows < len(lengths) + 8
  assert width & (width - 1) == 0 and width >= max(64, max(lengths))
  assert width == 64 or width < 2 * max(lengths)


@pytest.mark.parametrize("lengths", [[], [3, 0]])
def test_padded_shape_rejects_empty_input(lengths):
  with pytest.raises(ValueError, match="lengths"):
    padded_shape(lengths)


def test_chunk_size_must_be_positive(model):
  with pytest.raises(ValueError, match="chunk_size"):
    DecoderTeacher.of(model, chunk_size=0)
