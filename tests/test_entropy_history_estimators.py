"""EMPG and HGPO (issue 54, spec §4.4) against their loop references, on ragged batches, on
batches whose observations repeat across histories, and on degenerate ones."""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tirjax import advantages, segments
from tirjax.advantages.empg import EMPGOptions
from tirjax.advantages.hgpo import HGPOOptions
from tirjax.rollouts import from_numpy, to_numpy
from tirjax.testing.estimator_checks import check_padding, check_reference, check_row_permutation
from tirjax.testing.reference import REFERENCES
from tirjax.testing.strategies import tree_batches

VARIANTS = (
    ("empg", EMPGOptions()),
    ("empg", EMPGOptions(k=2.0, k_f=0.5, zeta=0.3, center=False)),
    ("empg", EMPGOptions(zscore=segments.ZScore(ddof=0, scale="none"))),
    ("hgpo", HGPOOptions()),
    ("hgpo", HGPOOptions(history=0)),
    ("hgpo", HGPOOptions(history=4, alpha=2.0, gamma=0.5, episode_weight=1.0,
                         zscore=segments.ZScore(ddof=0))),
    ("hgpo", HGPOOptions(drop_zero_levels=True, gamma=1.0)),
)
NAMES = ("empg", "hgpo")


def few_observations(r, seed: int, kinds: int = 2):
  """`r` with each observation (the tokens outside the loss after a step) replaced by one of
  `kinds` short token strings drawn per (row, step): steps with different histories then often
  see the same observation, which is what HGPO's levels tell apart."""
  a = {k: np.array(v) for k, v in to_numpy(r).items()}
  rng = np.random.default_rng(seed)
  B, L = a["tokens"].shape
  for b in range(B):
    last = -1
    for i in range(L):
      if a["loss_mask"][b, i]:
        last = int(a["token_step"][b, i])
      elif a["token_valid"][b, i] and last >= 0:
        a["tokens"][b, i] = 1 + (hash((b, last)) + rng.integers(0, kinds)) % kinds
  return from_numpy(a)


@given(tree_batches(), st.integers(0, 2**32 - 1))
def test_reference_row_permutation_and_padding(r, seed):
  check_reference(r, VARIANTS)
  check_row_permutation(r, seed, NAMES)
  check_padding(r, seed, NAMES)


@settings(max_examples=40)
@given(tree_batches(), st.integers(0, 2**32 - 1), st.integers(1, 3))
def test_hgpo_reference_when_observations_repeat_across_histories(r, seed, kinds):
  r = few_observations(r, seed, kinds)
  check_reference(r, [v for v in VARIANTS if v[0] == "hgpo"])


@given(tree_batches())
def test_empg_without_modulation_is_grpo(r):
  """k = 0, ζ = 0, no centering: g = 1 on every step, so EMPG is its base GRPO advantage."""
  out = advantages.get("empg")(r, EMPGOptions(k=0.0, zeta=0.0, center=False))
  np.testing.assert_allclose(out.steps, advantages.get("grpo")(r).steps, atol=1e-6)


@given(tree_batches())
def test_empg_scale_averages_to_one_and_confident_steps_scale_up(r):
  """g's mean over scored steps is 1, and g falls as the step's surprisal rises."""
  out = advantages.get("empg")(r, EMPGOptions(k=2.0))
  h = np.asarray(out.extras["step_entropy"])
  g = np.asarray(out.extras["gradient_scale"])
  scored = np.asarray(r.step_valid) & (h > 0)
  if scored.sum() < 2:
    return
  np.testing.assert_allclose(g[scored].mean(), 1.0, rtol=1e-5)
  order = np.argsort(h[scored])
  assert np.all(np.diff(g[scored][order]) <= 1e-6)


def test_hgpo_worked_levels():
  """One query, three rows of three steps, γ = 1, α = 1, K = 2, "mean_norm"; outcomes
  (1, 0, −1). Every first step sees the prompt: one group, (1, 0, −1). Before step 1 rows 0
  and 1 see x, row 2 sees y: levels 0 and 1 group rows 0, 1 → ±0.5; row 2 is alone (0).
  Before step 2 all see z. Level 0 (z): (1, 0, −1), weight 1; level 1 (z after x): rows 0, 1
  → ±0.5, weight 2; level 2 (z, x, prompt): ±0.5, weight 3; row 2 has level 0 only.
  Row 0: (1 + 2·0.5 + 3·0.5)/6 = 7/12; row 1: (0 − 1 − 1.5)/6 = −5/12; row 2: −1."""
  a = {k: np.array(v) for k, v in to_numpy(_three_rows()).items()}
  for b, seen in enumerate(((7, 8), (7, 8), (9, 9))):
    a["tokens"][b, :8] = [1, 2, 3, *seen, 4, 5, 6]
  r = from_numpy(a)
  out = advantages.get("hgpo")(r, HGPOOptions(gamma=1.0, history=2))
  np.testing.assert_allclose(np.asarray(out.steps)[:, 0], [1, 0, -1], atol=1e-6)
  np.testing.assert_allclose(np.asarray(out.steps)[:, 1], [0.5, -0.5, 0], atol=1e-6)
  np.testing.assert_allclose(np.asarray(out.steps)[:, 2], [7 / 12, -5 / 12, -1], atol=1e-6)
  np.testing.assert_allclose(out.extras["levels_used"], [[1, 2, 3], [1, 2, 3], [1, 0, 1]])


def _three_rows():
  """Three rows of one query, three steps each: prompt (2 tokens), step 0 (1), observation
  (2), step 1 (1), observation (1), step 2 (1); outcomes (1, 0, −1); token i is i + 1, so
  that no two observations of a row are the same."""
  from tirjax.rollouts import empty_arrays  # noqa: PLC0415
  B, T, L = 3, 3, 10
  a = empty_arrays(B, T, 1, 1, L)
  a["row_valid"][:] = True
  a["group_id"][:] = 0
  a["outcome"][:] = (1.0, 0.0, -1.0)
  a["num_steps"][:] = T
  a["answered"][:] = True
  a["step_valid"][:] = True
  a["node_id"][:] = np.arange(B * T).reshape(B, T)
  a["format_reward"][:] = 0.0
  a["token_valid"][:, :8] = True
  a["tokens"][:, :8] = np.arange(1, 9)
  for t, pos in enumerate((2, 5, 7)):
    a["loss_mask"][:, pos] = True
    a["token_step"][:, pos] = t
    a["old_logprobs"][:, pos] = -0.5 * (t + 1)
  return from_numpy(a)


@pytest.mark.parametrize("name", NAMES)
def test_no_loss_tokens_single_member_groups_and_equal_rewards_stay_finite(name):
  """Degenerate batches: rows without loss tokens, singleton groups, all-equal outcomes."""
  a = to_numpy(_three_rows())
  cases = {}
  no_loss = {k: v.copy() for k, v in a.items()}
  no_loss["loss_mask"][:] = False
  no_loss["token_step"][:] = -1
  cases["no_loss_tokens"] = no_loss
  single = {k: v.copy() for k, v in a.items()}
  single["group_id"][:] = (0, 1, 2)
  cases["singletons"] = single
  equal = {k: v.copy() for k, v in a.items()}
  equal["outcome"][:] = 1.0
  cases["all_equal"] = equal
  for label, arrays in cases.items():
    batch = from_numpy(arrays)
    out = advantages.get(name)(batch)
    for x in (out.tokens, out.steps, out.rows, *out.extras.values()):
      assert np.all(np.isfinite(np.asarray(x))), f"{name} / {label}"
    ref = REFERENCES[name](to_numpy(batch))
    np.testing.assert_allclose(out.steps, ref["steps"], atol=2e-5, err_msg=f"{name} / {label}")
  if name == "hgpo":  # nothing differs among the steps of a group: no relative advantage
    for label in ("singletons", "all_equal"):
      assert not np.any(np.asarray(advantages.get(name)(from_numpy(cases[label])).steps))


@pytest.mark.parametrize("make, field", [
    (lambda: EMPGOptions(k=-1.0), "k"),
    (lambda: EMPGOptions(zeta=float("nan")), "zeta"),
    (lambda: EMPGOptions(center=1), "center"),
    (lambda: HGPOOptions(history=-1), "history"),
    (lambda: HGPOOptions(history=1.5), "history"),
    (lambda: HGPOOptions(gamma=2.0), "gamma"),
    (lambda: HGPOOptions(zscore="std"), "zscore"),
])
def test_invalid_options_name_the_option(make, field):
  with pytest.raises(ValueError, match=field):
    make()


@settings(max_examples=30)
@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 64, 257]), st.sampled_from([1, 3]),
       st.sampled_from([0, 1, 6]))
def test_hgpo_key_ids_partition_like_numpy_unique(seed, n, width, rounds):
  """`key_ids` (hashed buckets, then its sorted fallback when a round budget runs out) gives
  equal keys equal ids and different keys different ids, ids in [0, N), 0 when masked."""
  from tirjax.advantages.hgpo import key_ids  # noqa: PLC0415
  rng = np.random.default_rng(seed)
  cols = [rng.integers(0, 4, n).astype(np.int32) for _ in range(width)]
  mask = rng.random(n) < 0.8
  ids = np.asarray(key_ids([jnp.asarray(c) for c in cols], jnp.asarray(mask), rounds))
  assert np.all((ids >= 0) & (ids < n)) and not np.any(ids[~mask])
  keys = np.stack(cols, 1)[mask]
  _, want = np.unique(keys, axis=0, return_inverse=True)
  got = ids[mask]
  pairs = set(zip(want.ravel().tolist(), got.tolist()))
  assert len(pairs) == len(set(want.ravel().tolist())) == len(set(got.tolist()))


@settings(max_examples=30)
@given(st.integers(0, 2**32 - 1), st.integers(1, 70), st.integers(1, 5))
def test_hgpo_running_max_is_cummax_along_positions(seed, length, width):
  """`running_max` (a scan) equals the running maximum along the leading axis, negative
  values (token_step's −1) and a first position below every later one included."""
  from tirjax.advantages.hgpo import running_max  # noqa: PLC0415
  rng = np.random.default_rng(seed)
  x = rng.integers(-3, 4, (length, width)).astype(np.int32)
  np.testing.assert_array_equal(np.asarray(running_max(jnp.asarray(x))),
                                np.maximum.accumulate(x, axis=0))
