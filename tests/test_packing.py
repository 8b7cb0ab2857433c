"""The packed update's host side (issue 38): a group's rows as a token-trie forest, forests
dealt into sequences by a token budget, bucketed sizes, and each query block's keys; checked
against plain references (prefix sets, brute-force ancestor relations) on random groups that
share prompts, branch like trees, repeat rows, end inside one another and start apart."""

import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from tirjax.train_steps import forest, packing


@st.composite
def row_groups(draw, max_rows=8, vocab=3):
  """Rows that extend a random prefix of an earlier row (or start afresh) by 0-6 tokens of
  a tiny vocabulary (so that unrelated rows also share tokens by chance)."""
  n = draw(st.integers(1, max_rows))
  rows = []
  for _ in range(n):
    if rows and draw(st.booleans()):
      base = rows[draw(st.integers(0, len(rows) - 1))]
      base = base[:draw(st.integers(0, len(base)))]
    else:
      base = []
    extra = draw(st.lists(st.integers(0, vocab - 1), min_size=0 if base else 1, max_size=6))
    rows.append(base + extra)
  return [np.asarray(r, np.int32) for r in rows]


def prefix_of(f: forest.Forest) -> dict:
  """Each packed token's prefix (root to token), read back through the rows' indices."""
  out = {}
  for idx in f.index:
    path = tuple(f.tokens[idx].tolist())
    for t, i in enumerate(idx):
      assert out.setdefault(int(i), path[:t + 1]) == path[:t + 1]  # one prefix per token
  return out


@given(row_groups())
def test_forest_is_the_trie_of_the_rows(seqs):
  f = forest.build(list(range(10, 10 + len(seqs))), seqs)
  prefixes = {tuple(s[:t + 1].tolist()) for s in seqs for t in range(len(s))}
  assert f.size == len(prefixes)  # every distinct prefix once: all sharing found, no more
  got = prefix_of(f)
  assert sorted(got.values()) == sorted(prefixes)
  for k, (s, idx) in enumerate(zip(seqs, f.index)):
    np.testing.assert_array_equal(f.tokens[idx], s)  # each row reads back
    np.testing.assert_array_equal(f.depth[idx], np.arange(len(s)))  # positions restart
    np.testing.assert_array_equal(f.prev[idx], np.concatenate([[-1], idx[:-1]]))
    assert f.rows[k] == 10 + k
  for i in range(f.size):
    for j in range(f.size):  # j is i or an ancestor iff j <= i <= seg_end[j]
      ancestor = got[i][:len(got[j])] == got[j]
      assert ancestor == (j <= i <= f.seg_end[j]), (i, j)


@given(row_groups(), st.data())
def test_needed_tokens_are_the_union_of_the_rows_needs(seqs, data):
  needed = [np.asarray(data.draw(st.lists(st.booleans(), min_size=len(s), max_size=len(s))))
            for s in seqs]
  f = forest.build(list(range(len(seqs))), seqs, needed)
  want = set()
  for idx, need in zip(f.index, needed):
    want |= set(idx[need].tolist())
  assert set(np.flatnonzero(f.needed).tolist()) == want
  shapes, bins = packing.plan([f], budget=64, shards=1, block=4)
  a = packing.layout([f], bins, shapes)
  assert shapes.targets >= len(want) and shapes.targets <= shapes.length
  s = [b for b, members in enumerate(bins) if members][0]
  np.testing.assert_array_equal(a["targets"][s, :len(want)], sorted(want))
  assert (a["targets"][s, len(want):] == -1).all()
  for slot in range(len(seqs)):  # a row reads each computed token's log-prob, and only those
    k = list(f.rows).index(a["row_id"][s, slot])
    slots = a["row_index"][s, slot, :len(seqs[k])]
    computed = f.needed[f.index[k]]
    assert (slots >= 0).tolist() == computed.tolist()
    np.testing.assert_array_equal(a["targets"][s, slots[computed]], f.index[k][computed])


def test_forest_degenerate_rows():
  seqs = [np.array([5]), np.array([5]), np.array([5, 6, 7]), np.array([9, 6])]
  f = forest.build([0, 1, 2, 3], seqs)
  assert f.size == 5  # [5], [5, 6], [5, 6, 7], [9], [9, 6]: two roots, a duplicate row
  assert list(f.prev[f.depth == 0]) == [-1, -1]
  np.testing.assert_array_equal(f.index[0], f.index[1])
  with pytest.raises(ValueError, match="at least one token"):
    forest.build([0], [np.array([], np.int32)])
  with pytest.raises(ValueError, match="rows: 1 ids for 2 sequences"):
    forest.build([0], seqs[:2])
  with pytest.raises(ValueError, match="rows: 2 ids for 2 sequences and 1 masks"):
    forest.build([0, 1], seqs[:2], [np.array([True])])


@given(st.integers(1, 100_000), st.sampled_from([1, 8, 64, 128]), st.sampled_from([1, 2, 4]))
def test_bucket_is_a_ladder_of_steps_sizes_an_octave(n, quantum, steps):
  b = packing.bucket(n, quantum, steps)
  assert b >= n and b % quantum == 0
  if n > steps * quantum:
    assert b < (1 + 1 / steps) * n + quantum  # at most one step of the ladder above n
  assert packing.bucket(b, quantum, steps) == b  # a ladder value is its own bucket
  units = b // quantum
  if units > steps:  # units = m · 2^e with m in [steps, 2 steps)
    e = (units // steps).bit_length() - 1
    assert units % 2**e == 0 and steps <= units // 2**e < 2 * steps
  if steps == 1:
    assert units & (units - 1) == 0  # powers of two


@given(st.lists(st.integers(1, 300), max_size=20), st.integers(1, 400), st.integers(1, 4),
       st.integers(1, 3))
def test_deal_places_every_forest_once_within_the_budget(sizes, budget, shards, at_least):
  bins = packing.deal(sizes, budget, shards, at_least)
  assert sorted(g for b in bins for g in b) == list(range(len(sizes)))
  assert len(bins) % shards == 0 and len(bins) >= at_least * shards
  capacity = max([budget, *sizes])
  assert all(sum(sizes[g] for g in b) <= capacity for b in bins)
  # no more micro-batches than first-fit decreasing needs (or than asked for)
  fitted = packing._first_fit(sizes, capacity)  # pylint: disable=protected-access
  assert len(bins) == max(at_least, math.ceil(len(fitted) / shards)) * shards


def _ancestors(prev, i):
  out = set()
  while i >= 0:
    out.add(i)
    i = prev[i]
  return out


@given(st.lists(row_groups(max_rows=5), min_size=1, max_size=4), st.sampled_from([1, 2, 4, 8]))
def test_layout_packs_forests_apart_and_blocks_hold_every_ancestor(groups, block):
  forests, start = [], 0
  for seqs in groups:
    forests.append(forest.build(list(range(start, start + len(seqs))), seqs))
    start += len(seqs)
  shapes, bins = packing.plan(forests, budget=24, shards=2, block=block)
  a = packing.layout(forests, bins, shapes)
  assert shapes.length % block == 0 and a["tokens"].shape == (shapes.sequences, shapes.length)
  seen = []
  for s, members in enumerate(bins):
    used = sum(forests[g].size for g in members)
    assert used <= shapes.length and a["valid"][s].sum() == used
    prev, end = a["prev"][s], a["seg_end"][s]
    owner = np.repeat(np.arange(len(members)), [forests[g].size for g in members])
    for i in range(used):
      anc = _ancestors(prev, i)
      assert all(owner[j] == owner[i] for j in anc)  # never across a forest's boundary
      assert {j for j in range(used) if j <= i <= end[j]} == anc
      keys = a["key_index"][s, i // block][a["key_valid"][s, i // block]]
      assert anc <= set(keys.tolist())  # the block reads every ancestor of its tokens
    for slot, row in enumerate(a["row_id"][s]):
      if row < 0:
        continue
      g, k = next((g, list(forests[g].rows).index(row)) for g in members
                  if row in forests[g].rows)
      slots = a["row_index"][s, slot]
      seq = groups[g][k]
      idx = a["targets"][s, slots[:len(seq)]]  # every token is needed here
      np.testing.assert_array_equal(a["tokens"][s, idx], seq)
      np.testing.assert_array_equal(a["positions"][s, idx], np.arange(len(seq)))
      assert (slots[:len(seq)] >= 0).all() and (slots[len(seq):] == -1).all()
      seen.append(int(row))
  assert sorted(seen) == list(range(start))
  assert not a["key_valid"][:, :, :].any(axis=2)[~a["valid"].reshape(
      shapes.sequences, -1, block).any(axis=2)].any()  # blocks of padding read nothing
