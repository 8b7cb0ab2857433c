"""What the trainer shows a person: progress, and the final before/after table.

On a terminal, a tqdm bar per phase and one for each evaluation, redrawn in place. Where the
output goes to a file or a pipe (`make run > log`), or bars are off (a run under
`experiments.ablate`, a benchmark), compact lines instead: one every `1/LINES_PER_PHASE` of a
phase's steps and at its end (a 1,200-step SFT prints 20 lines, not a redraw per step), and
one at the end of each evaluation.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Mapping, Optional, TextIO

from tqdm import tqdm

LINES_PER_PHASE = 20

# Every eval metric's label, in the order the tables print them: the trainer's after-SFT /
# after-RL table (`summary_table`, the keys in TRAIN_TABLE) and `experiments.evaluate`'s (all).
METRIC_LABELS = (("eval accuracy", "eval/accuracy"), ("average tool-call steps", "eval/avg_steps"),
                 ("unanswerable rate", "eval/unanswerable_rate"),
                 ("average formatting reward", "eval/format_reward"),
                 ("mean outcome", "eval/mean_outcome"), ("Solve-P", "eval/solve_p"),
                 ("Solve-R", "eval/solve_r"), ("Solve-F1", "eval/solve_f1"),
                 ("ToolHop answer correctness", "eval/answer_correctness"),
                 ("sampled accuracy", "eval/sampled_accuracy"),
                 ("sampled: pass@1", "eval/pass@1"), ("sampled: pass@4", "eval/pass@4"),
                 ("sampled: pass@16", "eval/pass@16"),
                 ("sampled: tasks with mixed outcomes", "eval/sampled_mixed"),
                 ("sampled: tasks with no right sample", "eval/sampled_all_wrong"),
                 ("P(the direction the question states), teacher-forced",
                  "eval/direction_p_right"))
TRAIN_TABLE = frozenset({
    "eval/accuracy", "eval/avg_steps", "eval/unanswerable_rate", "eval/format_reward",
    "eval/solve_f1", "eval/answer_correctness", "eval/pass@1", "eval/pass@4", "eval/pass@16",
    "eval/sampled_mixed", "eval/direction_p_right"})


class Progress:
  """A tqdm bar per phase with the current step, reward and accuracy, or compact lines."""

  def __init__(self, enabled: bool = True, out: Optional[TextIO] = None,
               lines_per_phase: int = LINES_PER_PHASE, quiet: bool = False,
               bar_file: Optional[TextIO] = None):
    """Bars when `enabled` and `bar_file` (default stderr, where tqdm draws) is a terminal;
    lines to `out` (default stdout) otherwise. `quiet`: neither (the processes other than 0
    of a multi-process run)."""
    self._bar_file = bar_file or sys.stderr
    self.enabled = enabled and not quiet and self._bar_file.isatty()
    self.quiet = quiet
    self.step = 0
    self._bar = None
    self._out = out
    self._lines = lines_per_phase
    self._phase, self._total, self._every = "", 0, 1

  def start(self, phase: str, total: int, done: int) -> None:
    self.close()
    self.step = done
    self._phase, self._total = phase, total
    self._every = max(1, -(-total // self._lines))  # ceil: at most `lines_per_phase` lines
    if self.enabled and total > 0:
      self._bar = tqdm(total=total, initial=done, desc=phase, dynamic_ncols=True,
                       file=self._bar_file)

  def update(self, step: int, **values: Optional[float]) -> None:
    shown = {k: f"{v:.3f}" for k, v in values.items() if v is not None}
    if self._bar is not None:
      self._bar.update(step - self.step)
      self._bar.set_postfix(shown)
    elif step == self._total or step % self._every == 0:
      extra = "".join(f" {k} {v}" for k, v in shown.items())
      self._line(f"{self._phase} step {step}/{self._total}{extra}")
    self.step = step

  def evaluation(self, total: int) -> Callable[[int], None]:
    """A callback `done -> None` for an evaluation of `total` tasks (a bar, or a line at the
    end)."""
    start = time.monotonic()
    if self.enabled:
      bar = tqdm(total=total, desc="eval", leave=False, dynamic_ncols=True, file=self._bar_file)

      def advance(done: int) -> None:
        bar.update(done - bar.n)
        if done >= total:
          bar.close()
      return advance

    def line(done: int) -> None:
      if done >= total:
        self._line(f"eval {total} tasks in {time.monotonic() - start:.1f} s")
    return line

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()
      self._bar = None

  def _line(self, text: str) -> None:
    if self.quiet:
      return
    print(text, file=self._out or sys.stdout, flush=True)


def summary_table(before: Mapping[str, float], after: Mapping[str, float],
                  stage: str = "SFT") -> str:
  """A Markdown table of the eval metrics after `stage` and after RL."""
  lines = [f"| metric | after {stage} | after RL |", "| --- | --- | --- |"]
  for label, key in METRIC_LABELS:
    if key in TRAIN_TABLE and (key in before or key in after):
      cells = [f"{m[key]:.3f}" if key in m else "—" for m in (before, after)]
      lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
  return "\n".join(lines)
