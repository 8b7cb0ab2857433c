"""The critic's arrays in the train state (issue 53): saved, summed and restored like the
policy's; a flipped byte in them is named; a state without a critic saves what it always did."""

import json
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tirjax import checkpoint as ck
from tirjax.testing.checkpoint_states import assert_same, make_state, target_like

# A critic leaf whose bytes can be found in the saved files: uniformly random bits, which the
# files' compression leaves as they are.
BITS = np.random.default_rng(0).integers(0, 2**32, 4096, dtype=np.uint32)


def with_critic(state, scale=1.0):
  params = {"head_w": jnp.linspace(-1.0, 1.0, 64) * scale,
            "head_b": jnp.asarray(scale, jnp.float32)}
  tx = optax.adam(1e-3)
  opt_state = tx.update(jax.tree.map(jnp.ones_like, params), tx.init(params), params)[1]
  return ck.TrainState(**{**vars(state), "critic_params": {**params, "bits": jnp.asarray(BITS)},
                          "critic_opt_state": opt_state})


def target(state):
  """An abstract target: shapes, dtypes and shardings only (no values to fall back on)."""
  base = target_like(state)
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = lambda tree: jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), tree)
  return ck.TrainState(**{**vars(base), "critic_params": abstract(state.critic_params),
                          "critic_opt_state": abstract(state.critic_opt_state)})


def assert_same_critic(restored, state):
  assert_same(restored, state)
  for tree in ("critic_params", "critic_opt_state"):
    got, want = getattr(restored, tree), getattr(state, tree)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_array_equal(a, b)


@pytest.fixture(scope="module")
def states():
  return {step: with_critic(make_state(step), scale=float(step)) for step in (1, 2)}


def saved(directory, states):
  with ck.Checkpointer(directory, "run-c", ck.CheckpointOptions(async_save=False)) as c:
    for step in sorted(states):
      c.save(states[step])


def test_a_critic_round_trips_bit_exact(tmp_path, states):
  saved(str(tmp_path), states)
  with ck.Checkpointer(str(tmp_path), "run-c") as c:
    assert_same_critic(c.restore(target(states[2])), states[2])
    assert_same_critic(c.restore(target(states[1]), step=1), states[1])
    meta = c.meta(2)
  assert meta["critic"] is True
  assert any(k.startswith("['critic']['params']") for k in meta["sums"])
  assert any(k.startswith("['critic']['opt_state']") for k in meta["sums"])


def _flip_in_critic(step_dir):
  """Flips one byte inside the critic's random leaf, wherever the OCDBT files hold it."""
  needle = BITS[1000:1016].tobytes()
  for path in pathlib.Path(step_dir, "arrays").rglob("*"):
    if path.is_file():
      data = bytearray(path.read_bytes())
      at = data.find(needle)
      if at >= 0:
        data[at + 32] ^= 0xFF
        path.write_bytes(bytes(data))
        return
  raise AssertionError(f"{step_dir}: the critic's leaf was not found in its files")


def test_a_flipped_byte_in_the_critic_is_named_and_the_older_step_restores(tmp_path, states):
  saved(str(tmp_path), states)
  step_dir = os.path.join(str(tmp_path), "2")
  _flip_in_critic(step_dir)
  with ck.Checkpointer(str(tmp_path), "run-c") as c:
    with pytest.raises(ck.CheckpointCorrupt,
                       match=rf"{step_dir}: checksum mismatch .*\['critic'\]\['params'\]"):
      c.restore(target(states[2]), step=2)
    with pytest.warns(RuntimeWarning, match=f"{step_dir}: checksum mismatch"):
      assert_same_critic(c.restore(target(states[2])), states[1])
  assert os.path.isdir(os.path.join(str(tmp_path), "corrupt-2"))


def test_a_state_without_a_critic_saves_what_it_always_saved(tmp_path):
  state = make_state(1)
  assert not state.has_critic
  saved(str(tmp_path), {1: state})
  meta = json.load(open(os.path.join(str(tmp_path), "1", "meta", "metadata")))
  assert "critic" not in meta and not any("critic" in k for k in meta["sums"])
  with ck.Checkpointer(str(tmp_path), "run-c") as c:
    restored = c.restore(target_like(state))
  assert_same(restored, state)
  assert restored.critic_params is None and restored.critic_opt_state is None


def test_restoring_across_critic_and_none_is_an_error_naming_the_step(tmp_path, states):
  saved(str(tmp_path), {1: states[1]})
  step_dir = os.path.join(str(tmp_path), "1")
  with ck.Checkpointer(str(tmp_path), "run-c") as c:
    with pytest.raises(ValueError, match=f"{step_dir}: saved with a critic, restored into a "
                       "state without one"):
      c.restore(target_like(states[1]))
  other = tmp_path / "other"
  saved(str(other), {1: make_state(1)})
  with ck.Checkpointer(str(other), "run-c") as c:
    with pytest.raises(ValueError, match="saved without a critic, restored into a state with"):
      c.restore(target(states[1]))
