"""What the trainer shows: bars redrawn in place on a terminal; where the output is a file or a
pipe, a line every 1/20 of a phase and at its end; evaluation progress."""

import io

from tirjax.trainer.progress import LINES_PER_PHASE, Progress


class Terminal(io.StringIO):
  """A stream that says it is a terminal."""

  def isatty(self):
    return True


def run_phase(progress, total, done=0):
  progress.start("sft", total=total, done=done)
  for step in range(done + 1, total + 1):
    progress.update(step, loss=1.0 / step, accuracy=None)
  progress.close()


def test_on_a_terminal_a_bar_is_redrawn_in_place_and_no_line_is_printed():
  term, out = Terminal(), io.StringIO()
  run_phase(Progress(out=out, bar_file=term), total=50)
  assert out.getvalue() == ""
  drawn = term.getvalue()
  assert drawn.count("\r") >= 50 and "50/50" in drawn and "\n" not in drawn.rstrip("\n")


def test_to_a_file_a_line_every_twentieth_of_a_phase_and_at_its_end():
  out = io.StringIO()
  run_phase(Progress(out=out, bar_file=io.StringIO()), total=1200)  # `make run`'s SFT
  lines = out.getvalue().splitlines()
  assert len(lines) == LINES_PER_PHASE == 20
  assert [int(line.split()[2].split("/")[0]) for line in lines] == list(range(60, 1201, 60))
  assert lines[0] == "sft step 60/1200 loss 0.017" and "\r" not in out.getvalue()


def test_lines_for_short_and_resumed_phases_and_when_bars_are_off():
  for total, done, every in ((3, 0, 1), (7, 0, 1), (45, 0, 3), (41, 0, 3), (100, 37, 5)):
    out = io.StringIO()
    # bars off (ablate's runs) prints lines even on a terminal
    run_phase(Progress(enabled=False, out=out, bar_file=Terminal()), total, done)
    steps = [int(line.split()[2].split("/")[0]) for line in out.getvalue().splitlines()]
    want = [s for s in range(done + 1, total + 1) if s % every == 0 or s == total]
    assert steps == want, (total, done)
    assert len(steps) <= LINES_PER_PHASE + 1
  out = io.StringIO()
  run_phase(Progress(out=out, bar_file=Terminal(), quiet=True), total=10)
  assert out.getvalue() == ""  # quiet: neither bars nor lines (processes other than 0)


def test_evaluation_progress_reports_when_the_tasks_are_done():
  out = io.StringIO()
  done = Progress(out=out, bar_file=io.StringIO()).evaluation(total=5)
  done(2)
  assert out.getvalue() == ""
  done(5)
  assert out.getvalue().startswith("eval 5 tasks in ")
  term, out = Terminal(), io.StringIO()
  bar = Progress(out=out, bar_file=term).evaluation(total=3)
  bar(1)
  bar(3)
  assert "eval" in term.getvalue() and out.getvalue() == ""
