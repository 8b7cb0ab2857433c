"""What the trainer shows: compact progress lines when bars are off, evaluation progress."""

import io

from tirjax.trainer.progress import Progress


def test_lines_when_bars_are_off_show_a_phase_advancing_and_its_end():
  out = io.StringIO()
  progress = Progress(enabled=False, out=out, line_every_s=0.0)
  progress.start("sft", total=3, done=0)
  for step in (1, 2, 3):
    progress.update(step, loss=0.5 / step)
  lines = out.getvalue().splitlines()
  assert lines == ["sft step 1/3 loss 0.500", "sft step 2/3 loss 0.250",
                   "sft step 3/3 loss 0.167"]
  # Rate-limited: with a long interval only the phase's end is shown.
  out = io.StringIO()
  progress = Progress(enabled=False, out=out, line_every_s=3600.0)
  progress.start("rl", total=4, done=1)
  for step in (2, 3, 4):
    progress.update(step, reward=0.1, accuracy=None)
  assert out.getvalue().splitlines() == ["rl step 4/4 reward 0.100"]


def test_evaluation_progress_reports_when_the_tasks_are_done(capsys):
  out = io.StringIO()
  done = Progress(enabled=False, out=out).evaluation(total=5)
  done(2)
  assert out.getvalue() == ""
  done(5)
  assert out.getvalue().startswith("eval 5 tasks in ")
  bar = Progress(enabled=True).evaluation(total=3)  # a tqdm bar on stderr
  bar(1)
  bar(3)
  assert "eval" in capsys.readouterr().err
