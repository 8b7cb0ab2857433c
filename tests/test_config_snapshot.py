"""Every estimator config × preset resolves to the values pinned in tests/config_snapshot.json
(issue 39), and `--print_config` names where each value came from."""

import json
import os
import subprocess
import sys

import pytest

from configs import base, grpo, hidifftir
from tirjax.testing import config_snapshot as snap
from tirjax.testing.short_runs import CONFIGS

PINNED = json.loads(snap.PATH.read_text())


def _changes(want: dict, got: dict) -> list[str]:
  missing = object()
  return [f"{k}: {want.get(k, '<absent>')!r} -> {got.get(k, '<absent>')!r}"
          for k in sorted(set(want) | set(got)) if want.get(k, missing) != got.get(k, missing)]


@pytest.mark.parametrize("name", CONFIGS)
def test_each_config_and_preset_resolves_to_its_pinned_values(name):
  assert name in PINNED, f"{name}: not in the snapshot (python -m tirjax.testing.config_snapshot)"
  base_case = snap.case(name, snap.BASE)
  assert base_case == PINNED[name][snap.BASE], _changes(
      PINNED[name][snap.BASE].get("values", {}), base_case.get("values", {}))
  for arg in snap.PRESETS:
    got = snap.case(name, arg)
    if "error" in got or "error" in base_case:
      assert got == PINNED[name][arg], arg
      continue
    differs = snap.diff(base_case["values"], got["values"])
    assert differs == PINNED[name][arg]["differs"], (arg, _changes(
        PINNED[name][arg]["differs"], differs))


def test_a_changed_preset_value_fails_the_snapshot(monkeypatch):
  """The comparison sees a named preset's value change (here cpu_scale's RL learning rate)."""
  original = base._cpu_scale

  def changed(c, env, steps_given):
    original(c, env, steps_given)
    c.optim.learning_rate = 1e-3

  monkeypatch.setattr(base, "_cpu_scale", changed)
  got = snap.case("grpo", snap.BASE)
  assert got != PINNED["grpo"][snap.BASE]
  assert _changes(PINNED["grpo"][snap.BASE]["values"], got["values"]) == [
      "optim.learning_rate: 0.0003 -> 0.001"]


def test_provenance_names_each_layer():
  c = hidifftir.get_config("model=tiny")
  with c.unlocked():
    c.rollout.n = 4
  source = {k: s for k, _, s in base.provenance(hidifftir.get_config, "configs/hidifftir.py",
                                                "model=tiny", c)}
  assert source["loss.kl_coef"] == "configs/hidifftir.py"
  assert source["model.tiny.hidden_size"] == "preset cpu_scale"
  assert source["sft.steps"] == "preset toolworld_headroom"  # cpu_scale's 800, then 1200
  assert source["rollout.n"] == "command line"
  assert source["seed"] == "default"
  assert source["model.preset"] == "default"  # tiny is the default model preset
  doors = grpo.get_config("model=tiny,env=doors")
  source = {k: s for k, _, s in base.provenance(grpo.get_config, "configs/grpo.py",
                                                "model=tiny,env=doors", doors)}
  assert source["env.name"] == "preset argument" and source["sft.steps"] == "preset doors"


def test_print_config_prints_each_key_with_its_source_and_trains_nothing(tmp_path):
  """`experiments.train --print_config`, run as a user runs it."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.train", "--config=configs/hidifftir.py:model=tiny",
       "--config.rollout.n=4", "--print_config", f"--workdir={tmp_path / 'run'}"],
      cwd=root, capture_output=True, text=True, timeout=600,
      env={**os.environ, "PYTHONPATH": root, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 0, proc.stderr[-2000:]
  lines = dict(line.split(" = ", 1) for line in proc.stdout.splitlines())
  assert lines["rollout.n"] == "4  # command line"
  assert lines["loss.kl_coef"].endswith("# configs/hidifftir.py")
  assert lines["sft.steps"].endswith("# preset toolworld_headroom")
  assert len(lines) > 100 and not (tmp_path / "run").exists()
