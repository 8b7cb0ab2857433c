"""tirjax.option_checks: each check passes good values and rejects bad ones, naming the option."""

import dataclasses
import math

import pytest

from tirjax import option_checks as oc

NOT_NUMBERS = [True, False, "1", None, [1]]


def _rejects(check, *args, message, **kwargs):
  with pytest.raises(ValueError) as info:
    check(*args, **kwargs)
  assert str(info.value) == message


def test_one_of():
  oc.one_of("mode", "tree", ("independent", "tree"))
  oc.one_of("matching", "greedy", {"hungarian": 0, "greedy": 1})  # a dict's keys
  _rejects(oc.one_of, "mode", "beam", ("independent", "tree"),
           message="mode: must be one of ('independent', 'tree'), got 'beam'")
  _rejects(oc.one_of, "matching", "km", {"hungarian": 0, "greedy": 1},
           message="matching: must be one of ('hungarian', 'greedy'), got 'km'")


def test_flag():
  oc.flag("greedy_baseline", True)
  oc.flag("greedy_baseline", False)
  for bad in (1, 0, "true", None):
    _rejects(oc.flag, "greedy_baseline", bad,
             message=f"greedy_baseline: must be True or False, got {bad!r}")


def test_int_at_least():
  oc.int_at_least("steps", 1, 1)
  oc.int_at_least("process_id", -1, -1)
  for bad in (0, 1.0, 2.5, True, "3", None):  # bools are not ints, nor are floats
    _rejects(oc.int_at_least, "steps", bad, 1,
             message=f"steps: must be an integer >= 1, got {bad!r}")


def test_at_least():
  oc.at_least("n", 1, 1)
  oc.at_least("temperature", 0.0, 0)
  oc.at_least("temperature", math.inf, 0)
  _rejects(oc.at_least, "n", 0, 1, message="n: must be >= 1, got 0")
  _rejects(oc.at_least, "memory_mb", 64, 128, why="the interpreter needs it",
           message="memory_mb: must be >= 128 (the interpreter needs it), got 64")
  for bad in NOT_NUMBERS + [math.nan]:
    _rejects(oc.at_least, "n", bad, 0, message=f"n: must be >= 0, got {bad!r}")


def test_above():
  oc.above("eps", 1e-9, 0)
  _rejects(oc.above, "eps", 0.0, 0, message="eps: must be > 0, got 0.0")
  _rejects(oc.above, "lam", -1, 0, why="a root", message="lam: must be > 0 (a root), got -1")
  for bad in NOT_NUMBERS + [math.nan]:
    _rejects(oc.above, "eps", bad, -1, message=f"eps: must be > -1, got {bad!r}")


def test_at_most():
  oc.at_most("train_tasks", 200_000, 200_000)
  _rejects(oc.at_most, "train_tasks", 200_001, 200_000, why="a limit",
           message="train_tasks: must be <= 200000 (a limit), got 200001")
  for bad in NOT_NUMBERS + [math.nan]:
    _rejects(oc.at_most, "p", bad, 1, message=f"p: must be <= 1, got {bad!r}")


@pytest.mark.parametrize("open_low, open_high, interval", [
    (False, False, "[0, 1]"), (True, False, "(0, 1]"), (False, True, "[0, 1)"),
    (True, True, "(0, 1)")])
def test_lies_in(open_low, open_high, interval):
  kwargs = dict(open_low=open_low, open_high=open_high)
  oc.lies_in("p", 0.5, 0, 1, **kwargs)
  edges = [(0, open_low), (1, open_high)]
  for edge, is_open in edges:
    if is_open:
      _rejects(oc.lies_in, "p", edge, 0, 1, **kwargs, message=f"p: must lie in {interval}, "
               f"got {edge}")
    else:
      oc.lies_in("p", edge, 0, 1, **kwargs)
  for bad in [-0.1, 1.1, math.nan, math.inf] + NOT_NUMBERS:
    _rejects(oc.lies_in, "p", bad, 0, 1, **kwargs,
             message=f"p: must lie in {interval}, got {bad!r}")


def test_finite_at_least():
  oc.finite_at_least("omega", 0, 0)
  oc.finite_at_least("omega", 2.5, 0)
  _rejects(oc.finite_at_least, "kl_clamp", -1.0, 0, why="0 = off",
           message="kl_clamp: must be a finite number >= 0 (0 = off), got -1.0")
  for bad in [math.nan, math.inf, -math.inf] + NOT_NUMBERS:
    _rejects(oc.finite_at_least, "omega", bad, -10,
             message=f"omega: must be a finite number >= -10, got {bad!r}")


def test_finite_above():
  oc.finite_above("learning_rate", 1e-6, 0)
  oc.finite_above("max_grad_norm", None, 0, none_ok=True)
  _rejects(oc.finite_above, "learning_rate", 0.0, 0,
           message="learning_rate: must be a finite number > 0, got 0.0")
  _rejects(oc.finite_above, "learning_rate", None, 0,
           message="learning_rate: must be a finite number > 0, got None")
  for bad in [1, math.nan, math.inf, True, "2"]:
    _rejects(oc.finite_above, "dual_clip", bad, 1, none_ok=True,
             message=f"dual_clip: must be None or a finite number > 1, got {bad!r}")


def test_is_finite_number():
  assert oc.is_finite_number(0) and oc.is_finite_number(-2.5)
  for bad in (math.nan, math.inf, -math.inf, True, "1", None):
    assert not oc.is_finite_number(bad)


def _section_classes():
  """Every options dataclass a config key lands in: the sections', each estimator's, each
  environment's own, and the dataclasses nested in them."""
  from tirjax import advantages  # noqa: PLC0415
  from tirjax.trainer import sections  # noqa: PLC0415
  todo = [c for n, c in sections.SECTIONS.items() if n != "advantage"]
  todo += [advantages.get(n).options for n in advantages.names()]
  todo += list(sections.env_sections().values())
  seen = []
  while todo:
    cls = todo.pop()
    if cls in seen:
      continue
    seen.append(cls)
    todo += [type(v) for f in dataclasses.fields(cls)
             if dataclasses.is_dataclass(v := getattr(cls(), f.name))]
  return seen


def test_every_typed_choice_of_a_config_rejects_a_bad_value_naming_it_and_the_allowed_ones():
  """Fields with a fixed set of values are typed `Literal[...]` and checked from the type:
  the error names the field, the allowed values and the bad one (issue 57)."""
  typed = {(cls.__name__, name): allowed for cls in _section_classes()
           for name, allowed in oc.choices_of(cls).items()}
  for key in [("RolloutOptions", "mode"), ("RolloutOptions", "answer_protocol"),
              ("JudgeOptions", "kind"), ("SamplerOptions", "kind"),
              ("OptimizerOptions", "schedule"), ("ZScore", "scale"),
              ("PORToolOptions", "fork_scale"), ("DistributedOptions", "cpu_collectives")]:
    assert key in typed, key
  for cls in _section_classes():
    for name, allowed in oc.choices_of(cls).items():
      with pytest.raises(ValueError) as e:
        cls(**{name: "no_such_value"})
      assert str(e.value) == f"{name}: must be one of {allowed}, got 'no_such_value'", (
          cls.__name__, str(e.value))
