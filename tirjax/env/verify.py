"""Substring verification of tool outputs and answers, as FTRL and ToolHop score them.

`contains_answer` is FTRL's `answer_verify` (bytedance/FTRL, Code/utils/utils.py): the
expected string is split on ", " and every part must occur in the output, both lowercased
with commas removed. It decides FTRL's per-call solves (Solve-P/R/F1, HiDiffTIR App. A.1) and
ToolHop's answer correctness (gold answer contained in the final response).
"""

from __future__ import annotations

import json
from typing import Any


def output_text(value: Any) -> str:
  """A tool output as text: JSON for objects and arrays, str() otherwise (as FTRL does)."""
  if isinstance(value, str):
    return value
  if isinstance(value, (dict, list)):
    try:
      return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
      return str(value)
  return str(value)


def _norm(text: str) -> str:
  return text.lower().replace(",", "").strip()


def contains_answer(output: Any, expected: str) -> bool:
  """True if every ", "-separated part of `expected` occurs in `output` (normalised)."""
  text = _norm(output_text(output))
  return all(_norm(part) in text for part in expected.split(", "))
