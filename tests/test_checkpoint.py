"""Orbax train-state checkpoints: round trip, keep-last-k, interrupted saves, other meshes,
and directories of other runs."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest

from tirjax import checkpoint as ck
from tirjax import sharding
from tirjax.testing.checkpoint_states import assert_same, make_state, target_like

MESH_SHAPES = {"fsdp8": (1, 8, 1), "data2_tensor4": (2, 1, 4), "tensor2": (1, 1, 2)}


def make_mesh(shape, devices=None):
  axes = tuple(zip(("data", "fsdp", "tensor"), shape))
  return sharding.make_mesh(sharding.ShardingOptions(mesh=axes), devices=devices)


@pytest.fixture(scope="module")
def states():
  return {step: make_state(step) for step in (1, 2, 3)}


def test_round_trip_and_keep_last_k(tmp_path, states):
  with ck.Checkpointer(str(tmp_path), "run-a", ck.CheckpointOptions(max_to_keep=2)) as c:
    for step in (1, 2, 3):
      c.save(states[step])
    c.wait()
    assert c.steps() == [2, 3] and c.latest_step() == 3
    assert sorted(os.listdir(tmp_path)) == ["2", "3", ck.RUN_FILE]
    assert_same(c.restore(target_like(states[3])), states[3])
    assert_same(c.restore(target_like(states[2]), step=2), states[2])
  with ck.Checkpointer(str(tmp_path), "run-a") as c:  # resuming the same run
    assert_same(c.restore(target_like(states[3])), states[3])


def test_raw_key_data_rng(tmp_path, states):
  state = ck.TrainState(**{**states[1].__dict__, "rng": jax.random.PRNGKey(7)})
  with ck.Checkpointer(str(tmp_path), "run-raw", ck.CheckpointOptions(async_save=False)) as c:
    c.save(state)
    target = ck.TrainState(**{**target_like(state).__dict__, "rng": jax.random.PRNGKey(0)})
    np.testing.assert_array_equal(c.restore(target).rng, jax.random.PRNGKey(7))


@pytest.mark.slow
@pytest.mark.parametrize("save_on, restore_on", [("fsdp8", "data2_tensor4"),
                                                 ("data2_tensor4", None),
                                                 (None, "tensor2")])
def test_restore_onto_another_mesh(tmp_path, save_on, restore_on):
  save_mesh = save_on and make_mesh(MESH_SHAPES[save_on])
  restore_mesh = restore_on and make_mesh(
      MESH_SHAPES[restore_on], devices=jax.devices()[:int(np.prod(MESH_SHAPES[restore_on]))])
  state = make_state(5, save_mesh)
  with ck.Checkpointer(str(tmp_path), "run-mesh") as c:
    c.save(state)
    target = target_like(state, restore_mesh)
    restored = c.restore(target)
  assert_same(restored, state)
  for got, want in zip(jax.tree.leaves(restored.params), jax.tree.leaves(target.params)):
    assert got.sharding == want.sharding
  if restore_mesh is not None:
    embed = restored.params["embed"][...]
    assert embed.sharding.spec == jax.sharding.PartitionSpec("tensor", "fsdp")


CHILD = textwrap.dedent("""
    import os, sys, time
    os.environ["JAX_PLATFORMS"] = "cpu"
    sys.path.insert(0, {root!r})
    import jax
    from orbax.checkpoint._src.path import atomicity
    from tirjax.testing.checkpoint_states import make_state
    from tirjax import checkpoint as ck

    directory, marker = sys.argv[1], sys.argv[2]
    c = ck.Checkpointer(directory, "run-kill")
    c.save(make_state(1))
    c.wait()

    async def hang(self):
      # Everything of step 2 is written; the commit (rename into place) never happens.
      open(marker, "w").close()
      time.sleep(600)

    atomicity.AtomicRenameTemporaryPath.finalize = hang
    c.save(make_state(2, seed=1))
    c.wait()
""")


def test_sigkill_during_save_keeps_the_previous_checkpoint(tmp_path):
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  script, marker = tmp_path / "child.py", tmp_path / "writing"
  script.write_text(CHILD.format(root=root))
  directory = tmp_path / "ckpt"
  child = subprocess.Popen([sys.executable, str(script), str(directory), str(marker)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  try:
    deadline = time.time() + 240
    while not marker.exists():
      assert child.poll() is None, child.stderr.read().decode()[-3000:]
      assert time.time() < deadline, "the child never reached the commit of step 2"
      time.sleep(0.2)
    os.kill(child.pid, signal.SIGKILL)
  finally:
    child.kill()
    child.wait()
  # The kill landed mid-save: step 2 exists only as an uncommitted temporary directory.
  leftovers = [e for e in os.listdir(directory) if e.startswith("2")]
  assert leftovers and all("tmp" in e for e in leftovers), leftovers
  state = make_state(1)
  with ck.Checkpointer(str(directory), "run-kill") as c:
    assert c.latest_step() == 1 and c.steps() == [1]
    assert_same(c.restore(target_like(state)), state)
    c.save(make_state(2, seed=1))  # the interrupted step can be saved again
    c.wait()
    assert c.steps() == [1, 2]


def test_failed_write_keeps_the_previous_checkpoint(tmp_path, states, monkeypatch):
  with ck.Checkpointer(str(tmp_path), "run-fail", ck.CheckpointOptions(async_save=False)) as c:
    c.save(states[1])

  from orbax.checkpoint._src.path import atomicity

  async def fail(self):
    raise OSError("No space left on device")

  monkeypatch.setattr(atomicity.AtomicRenameTemporaryPath, "finalize", fail)
  c = ck.Checkpointer(str(tmp_path), "run-fail", ck.CheckpointOptions(async_save=False))
  with pytest.raises(OSError, match="No space left"):
    c.save(states[2])
  monkeypatch.undo()
  with ck.Checkpointer(str(tmp_path), "run-fail") as c2:
    assert c2.steps() == [1]
    assert_same(c2.restore(target_like(states[1])), states[1])


def test_directories_of_other_runs_are_never_overwritten_silently(tmp_path, states):
  with ck.Checkpointer(str(tmp_path / "a"), "run-1") as c:
    c.save(states[1])
  with pytest.raises(ck.RunMismatch, match="belongs to run 'run-1'"):
    ck.Checkpointer(str(tmp_path / "a"), "run-2")
  assert sorted(os.listdir(tmp_path / "a")) == ["1", ck.RUN_FILE]

  (tmp_path / "b").mkdir()
  (tmp_path / "b" / "notes.txt").write_text("mine")
  with pytest.raises(ck.RunMismatch, match="not empty"):
    ck.Checkpointer(str(tmp_path / "b"), "run-2")
  assert (tmp_path / "b" / "notes.txt").read_text() == "mine"

  run_file = tmp_path / "a" / ck.RUN_FILE
  run_file.write_text('{"run_id": "run-1"')  # cut short
  with pytest.raises(ck.RunMismatch, match=f"{run_file}: cannot be read .*JSONDecodeError"):
    ck.Checkpointer(str(tmp_path / "a"), "run-1")
  run_file.write_text('{"run": "run-1"}')
  with pytest.raises(ck.RunMismatch, match=f"{run_file}: cannot be read .*KeyError"):
    ck.Checkpointer(str(tmp_path / "a"), "run-1")
  assert sorted(os.listdir(tmp_path / "a")) == ["1", ck.RUN_FILE]

  with ck.Checkpointer(str(tmp_path / "a"), "run-2", overwrite=True) as c:
    assert c.steps() == [] and c.latest_step() is None
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
      c.restore(target_like(states[1]))


def test_options_are_validated():
  with pytest.raises(ValueError, match="max_to_keep"):
    ck.CheckpointOptions(max_to_keep=0)
  with pytest.raises(ValueError, match="run_id"):
    ck.Checkpointer("/tmp/unused-tirjax-ckpt", "")


def test_on_commit_is_told_each_save_once_it_is_committed(tmp_path, states):
  """What `rundir.MetricsWriter` relies on to send a step to W&B only once no resume can
  redo it: a save is reported after its commit (at the next save, `wait` or `close`), once."""
  seen = []
  with ck.Checkpointer(str(tmp_path / "a"), "run-c", on_commit=seen.append) as c:
    c.save(states[1])
    c.save(states[2])  # Orbax commits step 1 before it starts step 2
    assert seen == [states[1].data_position] and c.steps() == [1, 2]
    c.wait()
    c.wait()
  assert seen == [states[1].data_position, states[2].data_position]
  seen.clear()
  with ck.Checkpointer(str(tmp_path / "b"), "run-c", ck.CheckpointOptions(async_save=False),
                       on_commit=seen.append) as c:
    c.save(states[1])
    assert seen == [states[1].data_position]
  assert seen == [states[1].data_position]
