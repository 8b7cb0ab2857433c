"""Python call strings and signatures, read with `ast` (never `eval`).

Ground truth of ToolHop (`gold_calls`) and BFCL (`possible_answer`) is written as Python calls,
e.g. `mv(source='a.txt', destination='tmp')` or `sort('report.pdf')`. Positional arguments
are named from the function's signature, which is read from the tool's source code.
"""

from __future__ import annotations

import ast
from typing import Mapping, Optional, Sequence


def function_params(source: str, class_name: Optional[str] = None) -> dict[str, list[str]]:
  """Parameter names of the top-level functions in `source` (or of `class_name`'s methods,
  `self` dropped), in positional order."""
  tree = ast.parse(source)
  body = tree.body
  if class_name is not None:
    cls = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == class_name), None)
    if cls is None:
      raise ValueError(f"class {class_name!r} is not defined in the source")
    body = cls.body
  out = {}
  for node in body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      names = [a.arg for a in node.args.posonlyargs + node.args.args]
      out[node.name] = names[1:] if class_name is not None else names
  return out


def _value(node: ast.AST):
  value = ast.literal_eval(node)
  return _jsonable(value)


def _jsonable(value):
  if isinstance(value, tuple):
    return [_jsonable(v) for v in value]
  if isinstance(value, list):
    return [_jsonable(v) for v in value]
  if isinstance(value, dict):
    return {str(k): _jsonable(v) for k, v in value.items()}
  if isinstance(value, (set, frozenset, complex, bytes)):
    raise ValueError(f"{type(value).__name__} values have no JSON form")
  return value


def parse_call(text: str, params: Optional[Mapping[str, Sequence[str]]] = None) -> dict:
  """`"f(1, b='x')"` → `{"name": "f", "arguments": {"a": 1, "b": "x"}}` given params["f"].

  Raises ValueError for anything but one call of a plain name with literal arguments.
  """
  try:
    node = ast.parse(text.strip(), mode="eval").body
  except SyntaxError as e:
    raise ValueError(f"not a Python call: {text!r} ({e.msg})") from e
  if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
    raise ValueError(f"not a call of a plain function name: {text!r}")
  name = node.func.id
  args: dict = {}
  if node.args:
    names = (params or {}).get(name)
    if names is None or len(node.args) > len(names):
      raise ValueError(f"{text!r}: cannot name the positional arguments of {name!r}")
    for param, arg in zip(names, node.args):
      args[param] = _value(arg)
  for kw in node.keywords:
    if kw.arg is None:
      raise ValueError(f"{text!r}: **kwargs are not supported")
    if kw.arg in args:
      raise ValueError(f"{text!r}: argument {kw.arg!r} given twice")
    args[kw.arg] = _value(kw.value)
  return {"name": name, "arguments": args}
