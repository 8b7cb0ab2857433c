"""The environment registry: what the trainer needs of each environment, by name (spec §6).

An environment registers one `Environment` from its own module; `tirjax.env.environments`
imports those modules, so that `environments.get(name)` and `environments.names()` know every
one (the only list of valid `env.name`s). The trainer, the config checks and the evaluation
entry point ask the entry, never the name: a new environment touches its own module and one
line of `tirjax/env/environments.py` (docs/adding_an_environment.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence

from tirjax.config import Preset
from tirjax.env.tools import Task

# (env config, seed, split, n, hop weights or ()) -> the first n tasks of the split
Draw = Callable[[Any, int, str, int, tuple], list]
# (data path, sandbox or None, task ids or None) -> the dataset's tasks, tool code defined in
# the sandbox (none without one)
Load = Callable[[str, Any, Optional[Sequence[str]]], list]
# (tasks, tokenizer, DemoOptions, num, seed) -> [(token ids, loss mask)]
Demonstrations = Callable[[Sequence[Task], Any, Any, int, int], list]
# (cache directory, seed) -> the directory of the tokenizer built for it
Tokenizer = Callable[[str, int], str]
# (model, tokenizer, tasks, answer protocol) -> metrics added to each evaluation
EvalExtras = Callable[[Any, Any, Sequence[Task], str], dict]
# (task, step results, answered, verdict) -> one label per turn (spec §4.5): `RIGHT`, or the
# kind of what the turn got wrong (any other string)
TurnLabels = Callable[[Task, Sequence, bool, str], list]
RIGHT = "right"  # the label of a right turn, whatever the environment
# (env config, hop weights) -> None, or ValueError("<field>: problem")
Check = Callable[[Any, tuple], None]
# (greedy eval episodes, their tasks by id, env.answer_in_tool_message) -> `eval/...` metrics
EpisodeMetrics = Callable[[Sequence, Mapping[str, Task], bool], dict]
# (task, step results, answered, answer) -> the kind of failure an episode failed by first
# (None: it was right)
FailureKind = Callable[[Task, Sequence, bool, Optional[str]], Optional[str]]
# (each sampled episode's failure kind, None for a right one) -> `eval/failure/<kind>` shares
FailureShares = Callable[[Sequence[Optional[str]]], dict]


@dataclasses.dataclass(frozen=True)
class Environment:
  """One environment.

  Attributes:
    name: its `env.name`.
    draw: draws tasks from a seed (generated environments), or None.
    load: reads a dataset file (`env.data_path`), or None; exactly one of draw and load.
    data_path: the default `env.data_path` ("": none needed, or the loader's own default).
    needs_data_file: `env.data_path` must name an existing file.
    demonstrations: SFT demonstrations of its tasks, or None (then `sft.steps` must be 0).
    tokenizer: builds a tokenizer for it, so that the tiny model trains from scratch without
      `model.hf_checkpoint`; None: a checkpoint brings its own.
    eval_extras: metrics of the policy itself added to each evaluation (toolworld: its
      preference for the stated directions), or None.
    turn_labels: labels each turn of an episode right or wrong from the task's ground-truth
      plan (spec §4.5), so that RL steps log where each estimator puts credit (`credit/*`);
      None: no plan to label from.
    episode_metrics: its benchmark's own metrics of the greedy eval episodes (ToolHop's answer
      correctness, BFCL's accuracy per category), or None.
    failure_kind, failure_shares: what each sampled eval episode got wrong first and the
      shares of those kinds (toolworld: direction, a miscopied argument, ...); both or none.
    options: the frozen dataclass of its own options, the config section `env.<name>` (toolworld:
      `Difficulty`, the query mix; `EnvOptions.options` holds them), or None.
    check: checks its own config values (toolworld: the query mix), or None.
    answer_protocols: the answer protocols its tasks can be answered in (empty: any).
    gold_answers: every task has a gold answer string (`Task.answer`), so IGPO's answer probes
      (`Rollouts.answer_logprob`, spec §4.4) can be scored on it.
    not_a_benchmark: why `experiments.evaluate` refuses it ("": a benchmark).
    presets: its config presets (`tirjax.config.Preset`), applied in order to a config of
      `env=<name>` whose preset argument matches each one's `when` (toolworld: the tiny model's
      RL design; bfcl: its shapes); the one place a config chooses values by environment.
  """

  name: str
  draw: Optional[Draw] = None
  load: Optional[Load] = None
  data_path: str = ""
  needs_data_file: bool = False
  demonstrations: Optional[Demonstrations] = None
  tokenizer: Optional[Tokenizer] = None
  eval_extras: Optional[EvalExtras] = None
  turn_labels: Optional[TurnLabels] = None
  episode_metrics: Optional[EpisodeMetrics] = None
  failure_kind: Optional[FailureKind] = None
  failure_shares: Optional[FailureShares] = None
  options: Optional[type] = None
  check: Optional[Check] = None
  answer_protocols: tuple[str, ...] = ()
  gold_answers: bool = False
  not_a_benchmark: str = ""
  presets: tuple[Preset, ...] = ()

  def __post_init__(self):
    if (self.draw is None) == (self.load is None):
      raise ValueError(f"environment {self.name!r}: give exactly one of draw and load")
    if (self.failure_kind is None) != (self.failure_shares is None):
      raise ValueError(f"environment {self.name!r}: give both failure_kind and failure_shares "
                       "or neither")


_REGISTRY: dict[str, Environment] = {}


def register(env: Environment) -> Environment:
  if env.name in _REGISTRY:
    raise ValueError(f"environment '{env.name}' is registered twice")
  _REGISTRY[env.name] = env
  return env


def get(name: str) -> Environment:
  if name not in _REGISTRY:
    raise KeyError(f"unknown environment '{name}'; registered: {names()}")
  return _REGISTRY[name]


def names(having: Optional[str] = None) -> list[str]:
  """The registered names, sorted; with `having`, those whose entry has that hook (e.g.
  "demonstrations": the environments SFT can warm-start on)."""
  return sorted(n for n, e in _REGISTRY.items() if having is None or getattr(e, having))
