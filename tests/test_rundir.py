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
