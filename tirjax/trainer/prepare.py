"""A run's checked options with rollout shapes that fit its data: all that is known before
any compute.

`experiment(config)` resolves the config (`resolve.resolve`: every value checked, the data
files present), then reads the tasks the run will use with the policy's tokenizer (no tool
code runs: `TaskSource(run_tools=False)`) and sizes the "auto" shapes from what they need, or
names, once, every shape set too small (`resolve.fit_to_data`, `shape_needs`). The trainer and
`experiments.evaluate` start from it, and the tests that check the documented commands call it
for each, without compute.
"""

from __future__ import annotations

import functools
from typing import Mapping, Optional

from absl import logging

from tirjax.env import chat
from tirjax.trainer import resolve, shape_needs
from tirjax.trainer.tasks import TaskSource, load_tokenizer, shared_tokenizer_dir


def experiment(config, splits: Optional[Mapping[str, int]] = None) -> resolve.Experiment:
  """The checked options of `config` with shapes fitted to the first `splits[s]` tasks of each
  split `s` (default: a run's, `env.train_tasks` of train and `env.eval_tasks` of eval).

  Raises:
    resolve.ConfigError: a bad value, missing data, or shapes too small for the data (all of
      them in one message).
  """
  exp = resolve.resolve(config)
  splits = dict(splits or {"train": exp.env.train_tasks, "eval": exp.env.eval_tasks})
  tok_dir = shared_tokenizer_dir(exp.model, exp.env, seed=exp.seed)
  needs = data_needs(exp.env, exp.seed, tok_dir, exp.rollout.answer_protocol,
                     tuple(splits.items()))
  where = f"the {' and '.join(splits)} split{'s' if len(splits) > 1 else ''}"
  warning = shape_needs.short_steps(needs, exp.rollout.max_steps, where)
  if warning:
    logging.warning(warning)
  return resolve.fit_to_data(exp, needs, where)


@functools.cache
def data_needs(env, seed: int, tokenizer_dir: str, answer_protocol: str,
               splits: tuple[tuple[str, int], ...]) -> shape_needs.Needs:
  """What the first n tasks of each (split, n) of `splits` need, their prompts rendered with the
  tokenizer in `tokenizer_dir` (`env` is the run's `EnvOptions`). Kept per process: the tests
  that check many configs read each dataset once."""
  tokenizer = load_tokenizer(tokenizer_dir)
  tasks = _tasks(env, seed, splits)
  lengths = [len(chat.render_prompt_ids(tokenizer, t, t.question, answer_protocol))
             for t in tasks]
  return shape_needs.needs(tasks, lengths)


@functools.lru_cache(maxsize=2)
def _tasks(env, seed: int, splits: tuple[tuple[str, int], ...]) -> tuple:
  """The first n tasks of each (split, n) of `splits`, their tools not defined."""
  source = TaskSource(env, seed=seed, run_tools=False)
  try:
    return tuple(t for split, n in splits for t in source.tasks(split, n))
  except (OSError, ValueError) as e:
    raise resolve.ConfigError(f"env.data_path: cannot read the {env.name} tasks: {e}") from None
  finally:
    source.close()
