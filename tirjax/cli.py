"""How the entry points (`experiments/`) start: absl's `app.run`, with a user's mistakes shown
as one message on stderr and exit status 1, never below a page of usage text or a traceback.

absl prints its usage text (the module docstring and every flag) above a `UsageError`'s
message, and a traceback for any other exception. A user's errors here are: a command line
the entry point refuses (`app.UsageError`), a config or its data (`ConfigError`: a bad value,
a missing dataset, shapes too small for it), a result that is never overwritten
(`FileExistsError`), and a `--config.*` override that names no key of the config or has the
wrong type (refused by ml_collections while the flags are parsed). Anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

from absl import app

from tirjax.trainer.resolve import ConfigError

USER_ERRORS = (app.UsageError, ConfigError, FileExistsError)


def run(main: Callable, prog: str = "") -> None:
  """`app.run(main)`, a user's error in `main` or in a `--config.*` override printed alone as
  `prog: message` (prog: the script's name)."""
  prog = prog or os.path.splitext(os.path.basename(sys.argv[0]))[0]

  def guarded(argv):
    try:
      return main(argv)
    except USER_ERRORS as e:
      sys.exit(f"{prog}: {e}")

  app.run(guarded, flags_parser=parse_flags)


def parse_flags(argv: list[str]) -> list[str]:
  """absl's own parsing (`app.parse_flags_with_usage`: a bad flag gets one line and a hint,
  not the usage text), with ml_collections' refusal of a `--config.*` override shown the
  same way."""
  try:
    return app.parse_flags_with_usage(argv)  # a flags.Error: absl's message, then exit 1
  except (AttributeError, KeyError, TypeError, ValueError) as e:
    overrides = [a.split("=", 1)[0] for a in argv[1:] if a.startswith("--config.")]
    sys.exit(f"FATAL Flags parsing error: a --config override was refused ({type(e).__name__}: "
             f"{e}); the overrides given: {', '.join(overrides) or 'none'}; each must name a key "
             "of the config, with a value of its type")
