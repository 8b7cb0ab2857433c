"""What the trainer shows a person: a progress bar, and the final before/after table."""

from __future__ import annotations

from typing import Mapping, Optional

from tqdm import tqdm

TABLE_ROWS = (("eval accuracy", "eval/accuracy"), ("average tool-call steps", "eval/avg_steps"),
              ("unanswerable rate", "eval/unanswerable_rate"),
              ("average formatting reward", "eval/format_reward"), ("Solve-F1", "eval/solve_f1"),
              ("ToolHop answer correctness", "eval/answer_correctness"))


class Progress:
  """A tqdm bar per phase with the current step, reward and accuracy (off: silent)."""

  def __init__(self, enabled: bool = True):
    self.enabled = enabled
    self.step = 0
    self._bar = None

  def start(self, phase: str, total: int, done: int) -> None:
    self.close()
    self.step = done
    if self.enabled and total > 0:
      self._bar = tqdm(total=total, initial=done, desc=phase, dynamic_ncols=True)

  def update(self, step: int, **values: Optional[float]) -> None:
    if self._bar is not None:
      self._bar.update(step - self.step)
      self._bar.set_postfix({k: f"{v:.3f}" for k, v in values.items() if v is not None})
    self.step = step

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()
      self._bar = None


def summary_table(before: Mapping[str, float], after: Mapping[str, float],
                  stage: str = "SFT") -> str:
  """A Markdown table of the eval metrics after `stage` and after RL."""
  lines = [f"| metric | after {stage} | after RL |", "| --- | --- | --- |"]
  for label, key in TABLE_ROWS:
    if key in before or key in after:
      cells = [f"{m[key]:.3f}" if key in m else "—" for m in (before, after)]
      lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
  return "\n".join(lines)
