"""Every environment, by name: importing this module registers them all (`tirjax.env.registry`;
one import line per environment)."""

from tirjax.env import bandit  # noqa: F401  doors
from tirjax.env.datasets import bfcl, ftrl, toolhop  # noqa: F401
from tirjax.env.registry import Environment, get, names
from tirjax.env.toolworld import environment  # noqa: F401  toolworld

__all__ = ["DEFAULT", "Environment", "get", "names"]

DEFAULT = "toolworld"  # the environment of a config that names none (`env.name`)
