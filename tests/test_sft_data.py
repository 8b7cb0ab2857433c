"""SFT batches: a pure function of the step, every demo once per epoch, little padding."""

import numpy as np
import pytest

from tirjax.trainer.sft_data import POOL, SFTData


def make_data(n=53, seed=0):
  rng = np.random.default_rng(seed)
  seqs = []
  for i in range(n):
    length = int(rng.integers(3, 300))
    ids = [i + 1] * length  # the row's id in every token: batches can be traced back
    seqs.append((ids, [0] * (length // 2) + [1] * (length - length // 2)))
  return SFTData.from_sequences(seqs, max_tokens=512, seed=seed), seqs


@pytest.mark.parametrize("batch_size", [1, 4, 16])
def test_each_epoch_sees_every_demo_at_most_once_and_rows_are_whole(batch_size):
  data, seqs = make_data()
  per_epoch = len(data) // batch_size
  for epoch in range(2):
    seen = []
    for step in range(epoch * per_epoch, (epoch + 1) * per_epoch):
      b = data.batch(step, batch_size)
      width = b["tokens"].shape[1]
      assert width % 64 == 0 or width == data.tokens.shape[1]
      for row, valid, mask in zip(b["tokens"], b["token_valid"], b["loss_mask"]):
        i = int(row[0]) - 1
        ids, loss = seqs[i]
        assert valid.sum() == len(ids) and width >= len(ids)  # never truncated
        assert list(row[:len(ids)]) == ids and list(mask[:len(ids)]) == loss
        seen.append(i)
    assert len(seen) == len(set(seen)) == per_epoch * batch_size


def test_batches_are_a_pure_function_of_the_step():
  a, _ = make_data()
  b, _ = make_data()
  for step in (0, 7, 3, 40):
    for k in ("tokens", "token_valid", "loss_mask"):
      np.testing.assert_array_equal(a.batch(step, 4)[k], b.batch(step, 4)[k])


def test_length_grouping_cuts_padding():
  data, seqs = make_data(n=400)
  per_epoch = len(data) // 16
  padded = sum(data.batch(s, 16)["tokens"].size for s in range(per_epoch))
  real = sum(data.batch(s, 16)["token_valid"].sum() for s in range(per_epoch))
  full = per_epoch * 16 * data.tokens.shape[1]
  assert padded < 0.8 * full and real / padded > 0.6, (padded, real, full)
  # Pools are shuffled: the widths are not sorted over an epoch.
  widths = [data.batch(s, 16)["tokens"].shape[1] for s in range(POOL)]
  assert widths != sorted(widths)


def test_a_batch_larger_than_the_data_is_an_error():
  data, _ = make_data(n=5)
  with pytest.raises(ValueError, match="sft.batch_size: 6 exceeds the 5 demonstrations"):
    data.batch(0, 6)
