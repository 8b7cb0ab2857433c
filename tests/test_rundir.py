"""The run directory's claim on a workdir: a new run creates it, the same run resumes it, and
anything else (another config, a config.json that cannot be read) is refused by name, with
nothing overwritten."""

import pytest

from tirjax import rundir


def test_a_workdir_is_claimed_resumed_or_refused_by_name(tmp_path):
  config = {"seed": 0, "train": {"steps": 4}}
  assert not rundir.claim(str(tmp_path), config)  # new
  assert rundir.claim(str(tmp_path), config)  # the same run: resumed
  with pytest.raises(rundir.WorkdirMismatch, match=r"another config \(seed: 0 -> 1\)"):
    rundir.claim(str(tmp_path), {**config, "seed": 1})
  path = tmp_path / "config.json"
  for garbled in ('{"seed": 0, "train": {', b"\xff\xfe not utf-8"):  # issue 30
    (path.write_text if isinstance(garbled, str) else path.write_bytes)(garbled)
    with pytest.raises(rundir.WorkdirMismatch, match=f"{path}: cannot be read as JSON"):
      rundir.claim(str(tmp_path), config)
    assert (path.read_text if isinstance(garbled, str) else path.read_bytes)() == garbled
  (tmp_path / "config.json").unlink()
  with pytest.raises(rundir.WorkdirMismatch, match="not empty and holds no config.json"):
    (tmp_path / "notes.txt").write_text("mine")
    rundir.claim(str(tmp_path), config)


def test_cell_json_has_one_writer_that_keeps_a_grid_s_cell(tmp_path):
  """The grid's runner writes cell.json with its recipe first; the trainer's own cell (keep)
  leaves it, and a standalone run gets the trainer's; `RunDir` reads it back."""
  grid_cell = {"label": "portool/omega1=0", "estimator": "portool", "options": {"omega1": 0},
               "seed": 1, "recipe": {"config_file": "configs/portool.py"}}
  trainer_cell = {"label": "portool", "estimator": "portool", "options": {}, "seed": 1}
  rundir.write_cell(str(tmp_path), grid_cell)
  rundir.write_cell(str(tmp_path), trainer_cell, keep=True)
  assert rundir.RunDir(str(tmp_path)).cell() == grid_cell
  rundir.write_cell(str(tmp_path), trainer_cell)
  assert rundir.RunDir(str(tmp_path)).cell() == trainer_cell
  alone = tmp_path / "alone"
  alone.mkdir()
  rundir.write_cell(str(alone), trainer_cell, keep=True)
  assert rundir.RunDir(str(alone)).cell() == trainer_cell
