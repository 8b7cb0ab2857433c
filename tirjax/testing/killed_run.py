"""The trainer's command line, SIGKILLed at an exact point: once checkpoint STEP is committed.

    python -m tirjax.testing.killed_run STEP --config=... --workdir=...

A kill that a test sends from outside, once it sees a checkpoint on disk, lands wherever the
run has got to by then (the next step may already be saved), so it cannot pick every resume
point. Here the run's own `Checkpointer` kills its process right after the save of STEP is
committed (Orbax has renamed it into place), as a power cut there would: nothing is flushed
or closed, the status stays "running", and the next start resumes from STEP. Only the run's
train-state checkpoints count (not the KL reference's). With several processes each kills
itself after the same save.
"""

import os
import runpy
import signal
import sys

from tirjax import rundir
from tirjax.checkpoint import Checkpointer


def main() -> None:
  if len(sys.argv) < 2 or not sys.argv[1].isdigit():
    sys.exit(f"usage: python -m tirjax.testing.killed_run STEP <experiments.train flags>; "
             f"got {sys.argv[1:2]}")
  kill_at = int(sys.argv.pop(1))
  save = Checkpointer.save

  def save_then_die(self, state):
    save(self, state)
    if os.path.basename(self.directory.rstrip("/")) == rundir.CHECKPOINTS and \
        int(state.step) == kill_at:
      self.wait()  # committed
      os.kill(os.getpid(), signal.SIGKILL)

  Checkpointer.save = save_then_die
  sys.argv[0] = "experiments.train"
  runpy.run_module("experiments.train", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
  main()
