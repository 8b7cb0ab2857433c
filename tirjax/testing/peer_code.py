"""A peer's code read for a cross-check, never copied into tirjax: a file at a commit of a
local git snapshot, and chosen functions (top-level, or one class's methods) compiled alone
from its syntax tree, decorators dropped, so nothing else of the peer is imported.

    commit = peer_code.resolve(repo, "HEAD")
    ns = {"torch": torch}                              # what the functions use
    peer_code.load(peer_code.source(repo, commit, path), ("f", "g"), ns, origin=f"verl:{path}")
    ns["f"](...)
"""

from __future__ import annotations

import ast
import os
import subprocess
from typing import Optional, Sequence


def git_dir(repo: str) -> str:
  """The git directory of a checkout, or `repo` itself when it is a bare one."""
  inner = os.path.join(repo, ".git")
  return inner if os.path.isdir(inner) else repo


def _git(repo: str, *args: str) -> str:
  return subprocess.run(["git", f"--git-dir={git_dir(repo)}", *args], check=True,
                        capture_output=True, text=True).stdout


def resolve(repo: str, rev: str) -> str:
  """The full commit hash `rev` names in `repo`."""
  return _git(repo, "rev-parse", rev).strip()


def source(repo: str, commit: str, path: str) -> str:
  """The text of `path` at `commit`."""
  return _git(repo, "show", f"{commit}:{path}")


def definitions(text: str, names: Sequence[str], *, cls: Optional[str] = None,
                origin: str = "<peer>") -> ast.Module:
  """The functions `names` of `text` (of class `cls` when given), in that order.

  Raises:
    ValueError: one of `names` is not defined there (the peer changed at this commit).
  """
  body = ast.parse(text).body
  if cls is not None:
    body = [n for c in body if isinstance(c, ast.ClassDef) and c.name == cls for n in c.body]
  found = {n.name: n for n in body if isinstance(n, ast.FunctionDef)}
  missing = sorted(set(names) - set(found))
  if missing:
    where = f"class {cls}" if cls else "the module"
    raise ValueError(f"{origin}: {where} defines no {missing} at this commit")
  for name in names:
    found[name].decorator_list = []
  return ast.Module(body=[found[name] for name in names], type_ignores=[])


def load(text: str, names: Sequence[str], ns: dict, *, cls: Optional[str] = None,
         origin: str = "<peer>") -> dict:
  """Compiles `definitions(text, names, cls=cls)` into `ns` (which holds what they use) and
  returns it: a method becomes a plain function of (self, ...)."""
  module = definitions(text, names, cls=cls, origin=origin)
  exec(compile(module, origin, "exec"), ns)  # pylint: disable=exec-used
  return ns
