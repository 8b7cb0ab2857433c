"""toolworld: the embedded default environment, a fictional world queried through tools.

  tasks = make_tasks("train", 1000, seed=0, difficulty=Difficulty())
  demos = make_demos(tasks, seed=0, options=DemoOptions())
  tokenizer_dir = build_tokenizer("cache/toolworld_tokenizer", seed=0)

Modules: `world` (the fictional world of one query), `toolbox` (the tools), `queries` (question
templates and their plans), `plan` (schedules and direct execution), `tasks` (splits and
difficulty knobs), `demos` (SFT demonstrations), `tokenizer` (the BPE tokenizer), `patterns`
(what a direction-blind policy, or an early answer, earns on a chain task).
"""

from tirjax.env.toolworld.demos import Demo, DemoOptions, demo_tokens, make_demos
from tirjax.env.toolworld.tasks import Difficulty, make_tasks, task_from_metadata
from tirjax.env.toolworld.tokenizer import build_tokenizer
from tirjax.env.toolworld.toolbox import TOOL_NAMES, make_tools

__all__ = ["Demo", "DemoOptions", "Difficulty", "TOOL_NAMES", "build_tokenizer", "demo_tokens",
           "make_demos", "make_tasks", "make_tools", "task_from_metadata"]
