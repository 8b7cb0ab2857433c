"""Real tool-use datasets behind the `Task` interface: ToolHop, the FTRL test split and BFCL
multi-turn. Loaders take a path (BFCL: the package's data folder by default) and a `Sandbox`
in which the datasets' tool code runs."""

from tirjax.env.datasets.bfcl import MULTI_TURN_CATEGORIES, load_bfcl
from tirjax.env.datasets.ftrl import load_ftrl
from tirjax.env.datasets.toolhop import load_toolhop

__all__ = ["MULTI_TURN_CATEGORIES", "load_bfcl", "load_ftrl", "load_toolhop"]
