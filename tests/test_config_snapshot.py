"""Every estimator config × preset resolves to the values pinned in tests/config_snapshot.json
(issue 39), and `--print_config` names where each value came from and what it is, for every
config file, an ablation cell's included (issue 57)."""

import ast
import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import pytest

from configs import cell, dapo, grpo, hidifftir
from tirjax import ablation, rundir
from tirjax.env import environments, registry
from tirjax.testing import config_snapshot as snap
from tirjax.testing.short_runs import CONFIGS
from tirjax.trainer import sections

ROOT = pathlib.Path(__file__).resolve().parents[1]

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
  changed = dataclasses.replace(sections.CPU_SCALE, values={
      **sections.CPU_SCALE.values, "optim.learning_rate": 1e-3})
  monkeypatch.setattr(sections, "CPU_SCALE", changed)
  got = snap.case("grpo", snap.BASE)
  assert got != PINNED["grpo"][snap.BASE]
  assert _changes(PINNED["grpo"][snap.BASE]["values"], got["values"]) == [
      "optim.learning_rate: 0.0003 -> 0.001"]


def test_a_changed_environment_preset_fails_the_snapshot(monkeypatch):
  """An environment's presets live on its registry entry, and the snapshot sees them change
  (here the doors preset's RL learning rate)."""
  doors = environments.get("doors")
  preset, = doors.presets
  changed = dataclasses.replace(preset, values={**preset.values, "optim.learning_rate": 1e-2})
  monkeypatch.setitem(registry._REGISTRY, "doors", dataclasses.replace(doors, presets=(changed,)))
  arg = "model=tiny,env=doors"
  differs = snap.diff(PINNED["grpo"][snap.BASE]["values"], snap.case("grpo", arg)["values"])
  assert _changes(PINNED["grpo"][arg]["differs"], differs) == [
      "optim.learning_rate: 0.003 -> 0.01"]


def test_presets_are_the_argument_s_then_cpu_scale_the_environment_s_and_smoke():
  def names(**settings):
    return [p.name for p in sections.presets({"model": "tiny", "env": "toolworld", "smoke": "",
                                               **settings})]
  assert names() == ["cpu_scale", "toolworld_headroom"]
  assert names(model="qwen3_1p7b") == []
  assert names(env="bfcl", smoke="1") == ["cpu_scale", "bfcl", "smoke"]
  assert names(model="qwen3_1p7b", env="doors") == ["doors"]


def test_the_config_module_chooses_no_value_by_environment_name():
  """Environment presets are on the environment's registry entry: neither the config module
  nor configs/base.py names an environment in its code."""
  for path in (ROOT / "tirjax" / "trainer" / "sections.py", ROOT / "configs" / "base.py"):
    tree = ast.parse(path.read_text())
    named = sorted({n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
                    and n.value in environments.names()})
    assert named == [], (path.name, named)


def test_make_keeps_no_hidden_switch():
  """Presets are applied one way: `build` after each layer is what `provenance` reads, and all
  layers rebuild exactly `make`'s config."""
  c = hidifftir.get_config("model=tiny,smoke=1")
  recipe = sections.made(c)
  names = sections.layer_names(recipe)
  assert names == ["default", "protocol", "preset argument", "preset cpu_scale",
                   "preset toolworld_headroom", "preset smoke"]
  assert sections.build(recipe).to_dict() == c.to_dict()
  assert sections.build(recipe, 3).train.steps == 100  # no named preset yet
  assert sections.build(recipe, 4).train.steps == 40  # cpu_scale
  assert not hasattr(sections, "_APPLIED") and "contextvars" not in (
      ROOT / "tirjax" / "trainer" / "sections.py").read_text()


def test_a_named_preset_never_overrides_the_preset_argument():
  assert grpo.get_config("model=tiny,steps=7").train.steps == 7
  assert grpo.get_config("model=tiny,smoke=1,steps=7").train.steps == 7
  assert grpo.get_config("model=tiny,smoke=1").train.steps == 2


def _sources(module, file, arg, final=None):
  final = final or module.get_config(arg)
  return {k: s for k, _, s in sections.provenance(module.get_config, file, arg, final)}


def test_provenance_names_each_layer():
  c = hidifftir.get_config("model=tiny")
  with c.unlocked():
    c.rollout.n = 4
  source = _sources(hidifftir, "configs/hidifftir.py", "model=tiny", c)
  assert source["loss.kl_coef"] == "configs/hidifftir.py"
  assert source["model.tiny.hidden_size"] == "preset cpu_scale"
  assert source["sft.steps"] == "preset toolworld_headroom"  # cpu_scale's 800, then 1200
  assert source["rollout.n"] == "command line"
  assert source["seed"] == "default"
  assert source["model.preset"] == "default"  # tiny is the default model preset
  source = _sources(grpo, "configs/grpo.py", "model=tiny,env=doors")
  assert source["env.name"] == "preset argument" and source["sft.steps"] == "preset doors"
  # what the config file sets after `make` (dapo's live references) is the file's
  source = _sources(dapo, "configs/dapo.py", "model=tiny")
  assert source["advantage.options.max_response_tokens"] == "configs/dapo.py"


def _print_config(spec, final):
  lines = dict(line.split(" = ", 1) for line in sections.provenance_text(spec, final).splitlines())
  return {k: v.split("  # ", 1)[1].partition(": ")[::2] for k, v in lines.items()}


_ARGS = {"estimator": "rloo"}  # config files whose argument is required


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "configs").glob("*.py")
                                        if p.stem not in ("__init__", "base", "cell")))
def test_print_config_works_for_every_config_file_and_describes_every_key(name):
  """Every config module in configs/ (an ablation grid's included: it has no estimator, so its
  keys are the grid's own; the generic configs/estimator.py with an estimator's name), each
  key with a source and, for an experiment, a description."""
  module = __import__(f"configs.{name}", fromlist=["get_config"])
  arg = _ARGS.get(name)
  config = module.get_config(arg)
  printed = _print_config(f"configs/{name}.py" + (f":{arg}" if arg else ""), config)
  assert set(printed) == set(rundir.flatten(config.to_dict()))
  if name == "ablate":
    return
  undescribed = sorted(k for k, (source, doc) in printed.items() if not doc)
  assert undescribed == [], undescribed
  assert all(source for source, _ in printed.values())


def test_every_environment_section_key_is_described():
  c = grpo.get_config("model=tiny")
  keys = [k for k in rundir.flatten(c.to_dict()) if k.split(".")[:2][-1] in
          sections.env_sections()]
  assert keys and all(sections.describe(k, c) for k in keys)


def test_a_choice_key_shows_its_allowed_values():
  c = grpo.get_config("model=tiny")
  assert sections.describe("judge.kind", c).endswith("(one of 'rule' | 'llm')")
  assert "one of 'std' | 'none'" in sections.describe("advantage.options.zscore.scale", c)
  assert sections.describe("train.steps", c) == "RL steps"


def test_print_config_works_for_an_ablation_cell(tmp_path):
  """configs/cell.py refuses no argument; `--print_config` with its run directory prints the
  cell's own config: the estimator's file as the protocol's source, the cell's overrides as
  the cell file's."""
  recipe = ablation.Recipe(str(ROOT / "configs" / "portool.py"), "model=tiny",
                           (("advantage.options.fork_scale", "none"), ("seed", 3)))
  (tmp_path / "cell.json").write_text(json.dumps({"recipe": recipe.to_json()}))
  final = cell.get_config(str(tmp_path))
  printed = _print_config(f"configs/cell.py:{tmp_path}", final)
  assert printed["seed"][0] == "configs/cell.py"
  assert printed["advantage.options.fork_scale"][0] == "configs/cell.py"
  assert printed["rollout.mode"][0] == os.path.relpath(ROOT / "configs" / "portool.py")
  assert printed["sft.steps"][0] == "preset toolworld_headroom"
  assert all(doc for _, doc in printed.values())


def test_print_config_prints_each_key_with_its_source_and_trains_nothing(tmp_path):
  """`experiments.train --print_config`, run as a user runs it, on an ablation cell."""
  recipe = ablation.Recipe(str(ROOT / "configs" / "hidifftir.py"), "model=tiny", ())
  (tmp_path / "cell.json").write_text(json.dumps({"recipe": recipe.to_json()}))
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.train", f"--config=configs/cell.py:{tmp_path}",
       "--config.rollout.n=4", "--print_config", f"--workdir={tmp_path / 'run'}"],
      cwd=ROOT, capture_output=True, text=True, timeout=600,
      env={**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 0, proc.stderr[-2000:]
  lines = dict(line.split(" = ", 1) for line in proc.stdout.splitlines())
  assert lines["rollout.n"].startswith("4  # command line: rows per query")
  assert lines["loss.kl_coef"].split("  # ")[1].startswith("configs/hidifftir.py: ")
  assert lines["sft.steps"].split("  # ")[1].startswith("preset toolworld_headroom: ")
  assert len(lines) > 100 and not (tmp_path / "run").exists()
