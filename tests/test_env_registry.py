"""The environment registry (issue 39): every environment is one entry, the trainer and the
config checks ask the entry, and a new environment needs its own module and one line."""

import ast
import dataclasses
import pathlib
import re

import pytest

from configs import grpo
from tirjax import advantages
from tirjax.env import bandit, environments, registry
from tirjax.env.toolworld.tasks import Difficulty
from tirjax.trainer import resolve
from tirjax.trainer.sections import EnvOptions
from tirjax.trainer.tasks import TaskSource

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_registry_is_the_list_of_environments():
  assert environments.names() == ["bfcl", "doors", "ftrl", "toolhop", "toolworld"]
  assert environments.names("demonstrations") == ["doors", "toolworld"]
  assert environments.DEFAULT in environments.names()
  assert environments.names("tokenizer") == ["doors", "toolworld"]
  assert environments.names("eval_extras") == ["toolworld"]
  for name in environments.names():
    env = environments.get(name)
    assert (env.draw is None) != (env.load is None), name
  with pytest.raises(KeyError, match="unknown environment 'nosuch'; registered"):
    environments.get("nosuch")
  with pytest.raises(ValueError, match="registered twice"):
    registry.register(environments.get("doors"))
  with pytest.raises(ValueError, match="exactly one of draw and load"):
    registry.Environment("x")


@pytest.fixture
def rooms():
  """A sixth environment, registered as its own module would: the doors' rooms without
  demonstrations, answered in `response_gen` only."""
  env = registry.register(dataclasses.replace(
      environments.get("doors"), name="test_rooms", demonstrations=None,
      answer_protocols=("response_gen",), not_a_benchmark=""))
  yield env
  registry._REGISTRY.pop("test_rooms")  # noqa: SLF001


def test_a_new_environment_is_one_entry_that_the_trainer_and_the_checks_follow(rooms):
  c = grpo.get_config("model=tiny")
  with c.unlocked():
    c.env.name = "test_rooms"
    c.rollout.answer_protocol = "answer_tag"
  with pytest.raises(resolve.ConfigError, match="rollout.answer_protocol: env test_rooms is "
                     "answered in response_gen only"):
    resolve.resolve(c)
  with c.unlocked():
    c.rollout.answer_protocol = "response_gen"
  with pytest.raises(resolve.ConfigError, match="sft.steps: demonstrations exist for doors and "
                     "toolworld only"):
    resolve.resolve(c)
  with c.unlocked():
    c.sft.steps = 0
  exp = resolve.resolve(c)
  tasks = TaskSource(exp.env, seed=3).tasks("train", 5)
  assert [t.task_id for t in tasks] == [t.task_id for t in bandit.make_tasks("train", 5, seed=3)]
  with pytest.raises(ValueError, match="env test_rooms: has no demonstrations"):
    TaskSource(exp.env, seed=3).demonstrations(tasks, None, None, 4)


# `<something>.name == "toolworld"`, `env_name in (...)`: a test of an environment's name.
NAME_TEST = re.compile(r"env(?:_cfg)?\.name\s*(?:==|!=|\bin\b|\bnot in\b)|"
                       r"env_name\s*(?:==|!=|\bin\b|\bnot in\b)")


def _entry_points_and_package():
  files = [p for p in (ROOT / "tirjax").rglob("*.py") if "env" not in p.relative_to(
      ROOT / "tirjax").parts[:1]]
  return files + sorted((ROOT / "experiments").glob("*.py"))


def test_no_environment_name_is_tested_outside_the_environments():
  """What an environment can do is asked of its entry (the config presets in configs/ choose
  values per environment, as a config file may)."""
  found = [f"{p.relative_to(ROOT)}:{i}" for p in _entry_points_and_package()
           for i, line in enumerate(p.read_text().splitlines(), 1) if NAME_TEST.search(line)]
  assert not found, found


def env_name_literals(source: str) -> list[tuple[int, str]]:
  """(line, name) of each string constant, docstrings aside, that is a registered environment
  name and not also an estimator's ("ftrl" names both: FTRL's reward and scorer)."""
  tree = ast.parse(source)
  docs = {id(n.body[0].value) for n in ast.walk(tree)
          if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
          and n.body and isinstance(n.body[0], ast.Expr)
          and isinstance(n.body[0].value, ast.Constant)}
  names = set(environments.names()) - set(advantages.names())
  return [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant)
          and isinstance(n.value, str) and id(n) not in docs and n.value in names]


def test_no_environment_name_is_written_outside_the_environments():
  """Issue 39: no env name as a value outside tirjax/env/ (and configs/): metadata keyed on a
  dataset's name (`== "toolhop"`) is a branch too. The benchmark and study scripts about one
  dataset (check_datasets, bench_sandbox) name theirs by design and are not scanned."""
  found = [f"{p.relative_to(ROOT)}:{line} {name}" for p in _entry_points_and_package()
           for line, name in env_name_literals(p.read_text())]
  assert found == []
  assert env_name_literals('"""toolworld"""\nx = t.metadata.get("dataset") == "toolhop"\n'
                           'y = "ftrl"\n') == [(2, "toolhop")]


@dataclasses.dataclass(frozen=True)
class _RoomOptions:
  doors: int = 2

  def __post_init__(self):
    if self.doors < 1:
      raise ValueError(f"doors: must be >= 1, got {self.doors}")


def test_an_environment_s_own_options_are_its_config_section(rooms):
  """`Environment.options` is the section `env.<name>` of every config; `resolve` reads the
  running environment's into `EnvOptions.options` and no other's."""
  c = grpo.get_config("model=tiny")
  with c.unlocked():
    c.env.toolworld.p_down = 0.3
  exp = resolve.resolve(c)
  assert exp.env.options == Difficulty(p_down=0.3, p_direction=1.0,  # the default's mix
                                      hop_weights=(0.35, 0.45, 0.2, 0.0))
  assert "options" not in c.env
  with_options = dataclasses.replace(rooms, options=_RoomOptions)
  registry._REGISTRY["test_rooms"] = with_options  # noqa: SLF001
  c = grpo.get_config("model=tiny")
  assert c.env.test_rooms.doors == 2
  with c.unlocked():
    c.env.update(name="test_rooms")
    c.env.test_rooms.doors = 5
    c.env.toolworld.p_down = 7.0  # another environment's section is not read
    c.rollout.answer_protocol = "response_gen"
    c.sft.steps = 0
  assert resolve.resolve(c).env.options == _RoomOptions(doors=5)
  with c.unlocked():
    c.env.test_rooms.doors = 0
  with pytest.raises(resolve.ConfigError, match="env.test_rooms.doors: must be >= 1"):
    resolve.resolve(c)
  with c.unlocked():
    c.env.test_rooms.doors = 1
    c.env.options = {"doors": 3}
  with pytest.raises(resolve.ConfigError, match="env.options: is no key"):
    resolve.resolve(c)


def test_env_options_belong_to_the_environment_named():
  assert EnvOptions(name="toolworld").options == Difficulty()
  assert EnvOptions(name="doors").options is None
  with pytest.raises(ValueError, match="options: env doors has no options of its own"):
    EnvOptions(name="doors", options=Difficulty())
  with pytest.raises(ValueError, match="options: env toolworld's are a Difficulty"):
    EnvOptions(name="toolworld", options=_RoomOptions())
