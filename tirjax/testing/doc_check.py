"""Checks commands as their entry points would run them, up to the first compute.

    python -m tirjax.testing.doc_check commands.json results.json

`commands.json` holds [{"id": ..., "module": "experiments.train", "argv": [...]}]; each command
is parsed by its module's own flags (absl, and ml_collections' `--config.*` overrides) and
then, where the module has one, checked by its `check(argv)`: what its `main` checks before
any compute (the train config resolved with shapes fitted to its data, an evaluation's policy
and data, an ablation grid planned, a report's runs read). `results.json` gets {id: "ok" or
the error}. Run from the directory the commands are written for (their relative paths).

One process imports what the entry points share (without touching JAX's devices), then forks
one child per module, which imports it (`define_flags()` defines the flags of a module that
defines them only when it runs) and checks its commands in turn, the flags reset between
them. A child is the only process that initialises JAX; the data a check reads is kept per
child (`prepare.data_needs`), so the configs of one dataset read it once.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections import defaultdict
from typing import Sequence

# What the entry points import (jax without its devices, the trainer's modules, transformers'
# tokenizers, the reports' scipy and matplotlib): in the parent, once, so that each child only
# adds its own module.
import jax  # noqa: F401  pylint: disable=unused-import
import transformers  # noqa: F401  pylint: disable=unused-import
from absl import flags

from tirjax import reporting  # noqa: F401  pylint: disable=unused-import
from tirjax.trainer import prepare  # noqa: F401  pylint: disable=unused-import


def check_command(module, argv: Sequence[str]) -> str:
  """"ok", or the error of one command of `module` (flags parsed as when it runs)."""
  fv = flags.FLAGS
  fv.unparse_flags()
  for name in [n for n in fv if "." in n]:  # --config.* overrides the last parse defined
    delattr(fv, name)
  sys.argv = [module.__name__, *argv]  # ml_collections reads the overrides from sys.argv
  try:
    rest = fv(sys.argv)
    check = getattr(module, "check", None)
    if check is not None:
      check(rest)
  except (Exception, SystemExit) as e:  # pylint: disable=broad-except
    return f"{type(e).__name__}: {e}"
  return "ok"


def check_module(name: str, commands: Sequence[dict]) -> dict[str, str]:
  """{id: result} of `commands`, all of module `name`."""
  try:
    module = importlib.import_module(name)
    if hasattr(module, "define_flags"):
      module.define_flags()
  except (Exception, SystemExit) as e:  # pylint: disable=broad-except
    return {c["id"]: f"import {name}: {type(e).__name__}: {e}" for c in commands}
  return {c["id"]: check_command(module, c["argv"]) for c in commands}


def _in_child(name: str, commands: Sequence[dict]) -> dict[str, str]:
  """`check_module` in a forked child; a child that dies names its exit status."""
  read, write = os.pipe()
  pid = os.fork()
  if pid == 0:  # the child: its results down the pipe, then out without cleanup handlers
    os.close(read)
    code = 0
    try:
      with os.fdopen(write, "w") as f:
        json.dump(check_module(name, commands), f)
    except BaseException:  # pylint: disable=broad-except
      code = 1
    os._exit(code)  # pylint: disable=protected-access
  os.close(write)
  with os.fdopen(read) as f:
    text = f.read()
  _, status = os.waitpid(pid, 0)
  if status or not text:
    return {c["id"]: f"the check of {name} died (wait status {status})" for c in commands}
  return json.loads(text)


def main(argv: Sequence[str]) -> None:
  commands_path, results_path = argv[1:]
  with open(commands_path) as f:
    commands = json.load(f)
  by_module = defaultdict(list)
  for c in commands:
    by_module[c["module"]].append(c)
  results = {}
  for name, group in by_module.items():
    results.update(_in_child(name, group))
  with open(results_path, "w") as f:
    json.dump(results, f, indent=1)


if __name__ == "__main__":
  main(sys.argv)
