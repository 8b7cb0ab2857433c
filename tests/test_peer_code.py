"""The cross-check studies' reader of a peer's code (tirjax/testing/peer_code.py): the
chosen functions alone, decorators dropped, methods as plain functions, a missing one named."""

import subprocess

import pytest

from tirjax.testing import peer_code

PEER = '''
import not_installed_anywhere

def registry(f):
  raise AssertionError("a decorator ran")

@registry
def double(x):
  return helper(x) * 2

def unwanted():
  raise AssertionError

class Trainer:
  @registry
  def scale(self, x):
    return x * self.k
'''


def test_functions_and_methods_compile_alone():
  ns = peer_code.load(PEER, ("double",), {"helper": lambda x: x + 1})
  assert ns["double"](3) == 8 and "unwanted" not in ns and "registry" not in ns
  ns = peer_code.load(PEER, ("scale",), {}, cls="Trainer")
  assert ns["scale"](type("S", (), {"k": 5})(), 2) == 10


def test_a_missing_function_is_named():
  with pytest.raises(ValueError, match=r"peer.py: class Trainer defines no \['double'\]"):
    peer_code.definitions(PEER, ("double",), cls="Trainer", origin="peer.py")
  with pytest.raises(ValueError, match=r"the module defines no \['gone'\]"):
    peer_code.definitions(PEER, ("double", "gone"))


def test_source_at_a_commit(tmp_path):
  repo = str(tmp_path)
  git = lambda *a: subprocess.run(["git", "-C", repo, *a], check=True, capture_output=True)
  git("init", "-q")
  (tmp_path / "m.py").write_text("first")
  git("add", "m.py")
  git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
  first = peer_code.resolve(repo, "HEAD")
  (tmp_path / "m.py").write_text("second")
  git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "two")
  assert peer_code.source(repo, first, "m.py") == "first"
  assert peer_code.source(repo, peer_code.resolve(repo, "HEAD"), "m.py") == "second"
  assert peer_code.git_dir(repo) == str(tmp_path / ".git")
