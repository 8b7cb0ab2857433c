"""Checkpoint integrity (issue 14): each kind of corruption of the latest step is reported by
its directory, and a restore falls back to the newest intact step, keeping the corrupt one."""

import glob
import json
import os
import shutil

import pytest

from tests.test_checkpoint import assert_same, make_state, target_like
from tirjax import checkpoint as ck


def _largest_data_file(step_dir):
  return max(glob.glob(os.path.join(step_dir, "arrays", "ocdbt.process_0", "d", "*")),
             key=os.path.getsize)


def flip_bytes(step_dir):
  path = _largest_data_file(step_dir)
  data = bytearray(open(path, "rb").read())
  data[len(data) // 2] ^= 0xFF
  open(path, "wb").write(bytes(data))


def truncate_file(step_dir):
  path = _largest_data_file(step_dir)
  data = open(path, "rb").read()
  open(path, "wb").write(data[:len(data) // 2])


def garble_metadata(step_dir):
  open(os.path.join(step_dir, "meta", "metadata"), "w").write('{"step": 2, "policy')


def edit_metadata(step_dir):
  """Valid JSON with one changed field: only the metadata's own checksum notices."""
  path = os.path.join(step_dir, "meta", "metadata")
  meta = json.load(open(path))
  meta["data_position"]["index"] += 1
  json.dump(meta, open(path, "w"))


def remove_arrays(step_dir):
  shutil.rmtree(os.path.join(step_dir, "arrays"))


CORRUPTIONS = {"flipped_byte": (flip_bytes, "checksum mismatch"),
               "truncated_file": (truncate_file, "arrays cannot be read"),
               "garbled_metadata": (garble_metadata, "metadata cannot be read"),
               "edited_metadata": (edit_metadata, "metadata fails its checksum"),
               "missing_item": (remove_arrays, "arrays cannot be read")}


@pytest.fixture(scope="module")
def states():
  return {step: make_state(step) for step in (1, 2)}


def saved_two_steps(directory, states):
  with ck.Checkpointer(directory, "run-i", ck.CheckpointOptions(async_save=False)) as c:
    c.save(states[1])
    c.save(states[2])


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_corrupt_latest_step_is_named_and_the_newest_intact_one_restores(tmp_path, states, kind):
  corrupt, reason = CORRUPTIONS[kind]
  saved_two_steps(str(tmp_path), states)
  step_dir = os.path.join(str(tmp_path), "2")
  corrupt(step_dir)
  files_before = sorted(os.path.relpath(p, step_dir)
                        for p in glob.glob(step_dir + "/**", recursive=True))
  with ck.Checkpointer(str(tmp_path), "run-i") as c:
    with pytest.raises(ck.CheckpointCorrupt, match=f"{step_dir}: .*{reason}"):
      c.restore(target_like(states[2]), step=2)  # an explicit step never falls back
    with pytest.warns(RuntimeWarning, match=f"{step_dir}: .*{reason}"):
      restored = c.restore(target_like(states[2]))
    assert_same(restored, states[1])
    # Kept for inspection, not deleted, and out of the way of the run's next save.
    kept = os.path.join(str(tmp_path), "corrupt-2")
    assert sorted(os.path.relpath(p, kept)
                  for p in glob.glob(kept + "/**", recursive=True)) == files_before
    assert c.steps() == [1]
    c.save(states[2])
    c.wait()
    assert_same(c.restore(target_like(states[2])), states[2])


def test_every_step_corrupt_raises_naming_each_and_moves_nothing(tmp_path, states):
  saved_two_steps(str(tmp_path), states)
  flip_bytes(os.path.join(str(tmp_path), "2"))
  garble_metadata(os.path.join(str(tmp_path), "1"))
  with ck.Checkpointer(str(tmp_path), "run-i") as c:
    with pytest.warns(RuntimeWarning), pytest.raises(ck.CheckpointCorrupt) as err:
      c.restore(target_like(states[2]))
  assert os.path.join(str(tmp_path), "2") in str(err.value)
  assert os.path.join(str(tmp_path), "1") in str(err.value)
  assert sorted(os.listdir(tmp_path)) == ["1", "2", ck.RUN_FILE]


def test_a_checkpoint_without_sums_restores_with_a_warning(tmp_path, states):
  """Steps saved before checksums existed: restored, never silently."""
  saved_two_steps(str(tmp_path), states)
  path = os.path.join(str(tmp_path), "2", "meta", "metadata")
  meta = json.load(open(path))
  del meta["sums"], meta["meta_sum"]
  json.dump(meta, open(path, "w"))
  with ck.Checkpointer(str(tmp_path), "run-i") as c:
    with pytest.warns(RuntimeWarning, match="without checksums"):
      assert_same(c.restore(target_like(states[2])), states[2])


def test_the_target_may_depend_on_the_saved_metadata(tmp_path, states):
  saved_two_steps(str(tmp_path), states)
  seen = []

  def target(meta):
    seen.append(meta["step"])
    return target_like(states[meta["step"]])

  with ck.Checkpointer(str(tmp_path), "run-i") as c:
    assert_same(c.restore(target), states[2])
  assert seen == [2]
