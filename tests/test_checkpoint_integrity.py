"""Checkpoint integrity (issue 14): each kind of corruption of the latest step is reported by
its directory, and a restore falls back to the newest intact step, keeping the corrupt one."""

import glob
import json
import os
import re
import shutil
import warnings

import pytest

from tirjax import checkpoint as ck
from tirjax.testing.checkpoint_states import assert_same, make_state, target_like


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


# Files a restore never opens (issue 30): a byte of process 0's own OCDBT b-tree (superseded by
# the merged tree under arrays/), its manifest, a commit marker. The restored state is intact
# either way; the files' record names what changed, and nothing falls back.
def flip_btree_byte(step_dir):
  big = _largest_data_file(step_dir)
  nodes = [p for p in glob.glob(os.path.join(step_dir, "arrays", "ocdbt.process_0", "d", "*"))
           if p != big]
  path = min(nodes, key=os.path.getsize)
  data = bytearray(open(path, "rb").read())
  data[len(data) // 2] ^= 0xFF
  open(path, "wb").write(bytes(data))
  return os.path.relpath(path, step_dir), "changed"


def remove_process_manifest(step_dir):
  os.remove(os.path.join(step_dir, "arrays", "ocdbt.process_0", "manifest.ocdbt"))
  return os.path.join("arrays", "ocdbt.process_0", "manifest.ocdbt"), "missing"


def remove_commit_marker(step_dir):
  os.remove(os.path.join(step_dir, "commit_success.txt"))
  return "commit_success.txt", "missing"


UNREAD = {"flipped_btree_byte": flip_btree_byte, "removed_process_manifest":
          remove_process_manifest, "removed_commit_marker": remove_commit_marker}


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
  os.remove(os.path.join(str(tmp_path), "2", ck.FILES))  # nor a record of its files
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


@pytest.mark.parametrize("kind", sorted(UNREAD))
def test_a_changed_file_that_no_restore_reads_is_named_and_the_state_kept(tmp_path, states,
                                                                          kind):
  saved_two_steps(str(tmp_path), states)
  step_dir = os.path.join(str(tmp_path), "2")
  rel, what = UNREAD[kind](step_dir)
  with ck.Checkpointer(str(tmp_path), "run-i") as c:
    with pytest.warns(RuntimeWarning, match=f"{step_dir}: 1 file.*{re.escape(rel)}: {what}"):
      restored = c.restore(target_like(states[2]))
    assert_same(restored, states[2])  # verified by the sums of what it read
    assert c.steps() == [1, 2]  # nothing moved aside


def test_an_intact_checkpoint_restores_without_a_word(tmp_path, states):
  with ck.Checkpointer(str(tmp_path), "run-i") as c:  # saved in the background
    c.save(states[1])
    c.save(states[2])
  for step in ("1", "2"):
    assert os.path.exists(os.path.join(str(tmp_path), step, ck.FILES))
  with ck.Checkpointer(str(tmp_path), "run-i") as c, warnings.catch_warnings():
    warnings.simplefilter("error", RuntimeWarning)
    assert_same(c.restore(target_like(states[2])), states[2])


def test_the_kl_reference_is_a_verified_checkpoint_of_its_run(tmp_path):
  """Issue 39: the KL reference was a second Orbax checkpoint without sums; a corrupt one would
  have anchored the KL term to garbage. Now it is saved once, restored as saved by a resumed
  run (not replaced by the resumed policy), and a flipped byte stops the run by name."""
  import jax  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415
  from tirjax.trainer import weights  # noqa: PLC0415
  first, later = make_state(step=2), make_state(step=7)
  later = ck.TrainState(step=7, params=jax.tree.map(lambda x: x + 1, later.params),
                        opt_state=later.opt_state, rng=later.rng, data_position={},
                        policy_version=later.policy_version)
  runs = {}

  def run(run_id):  # the run's own checkpointer, each run in a directory of its own
    if run_id not in runs:
      runs[run_id] = ck.Checkpointer(str(tmp_path / f"checkpoints-{run_id}"), run_id,
                                     ck.CheckpointOptions(async_save=True))
    return runs[run_id]

  run("run-a").save(first)  # the state as RL starts, saved in the background
  weights.reference_params(first, str(tmp_path), run("run-a"))
  # ...and committed before the reference's own save (two Orbax managers finalising at once
  # abort a multi-process run: "Barrier ... is already ongoing")
  assert run("run-a")._in_flight is None and run("run-a").latest_step() == 2
  restored = weights.reference_params(later, str(tmp_path), run("run-a"))
  for got, saved in zip(jax.tree.leaves(restored), jax.tree.leaves(first.params), strict=True):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(saved))
  with pytest.raises(ck.RunMismatch):
    weights.reference_params(later, str(tmp_path), run("run-b"))
  flip_bytes(os.path.join(str(tmp_path), "reference", "0"))
  with pytest.raises(ck.CheckpointCorrupt, match=re.escape(os.path.join("reference", "0"))):
    weights.reference_params(later, str(tmp_path), run("run-a"))
  for c in runs.values():
    c.close()
