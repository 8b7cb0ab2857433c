"""Cell labels: an estimator and its option overrides in one string.

    split_label("portool/omega1=0,loss.clip_high=0.28")
    # -> ("portool", {"omega1": 0, "loss.clip_high": 0.28})

The one parser of `estimator[/key=value,...]`, shared by the ablation grid
(`tirjax.ablation.grid.parse_label`, which maps keys onto config keys) and the credit bench
(`tirjax.credit.cells.parse_cell`). A value is read as JSON when it parses (numbers, booleans,
lists), else kept as the string written.
"""

from __future__ import annotations

import json
from typing import Any


def _value(text: str) -> Any:
  try:
    return json.loads(text)
  except json.JSONDecodeError:
    return text


def split_label(label: str) -> tuple[str, dict[str, Any]]:
  """`estimator[/key=value,...]` → (estimator, {key: value}), keys in the order written.

  Raises:
    ValueError: an item without `=` or a key, or a key given twice; the message names the
      label and the item.
  """
  name, _, rest = label.partition("/")
  options: dict[str, Any] = {}
  for item in filter(None, (s.strip() for s in rest.split(","))):
    key, sep, text = (s.strip() for s in item.partition("="))
    if not sep or not key:
      raise ValueError(f"cell '{label}': expected key=value items after '/', got '{item}'")
    if key in options:
      raise ValueError(f"cell '{label}': '{key}' is given twice")
    options[key] = _value(text)
  return name.strip(), options
