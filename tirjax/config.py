"""Bridges between ml_collections configs and the library's frozen option dataclasses.

Each component's options are a frozen dataclass whose defaults are the spec's and whose
`__post_init__` rejects bad values. A config section is generated from that dataclass (so the
config lists every option, and a mistyped key fails on the locked config), and turned back
into the dataclass before any compute (so an invalid value fails early, naming the key).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import io
import re
import textwrap
import tokenize
import typing
from typing import Any, Collection, Mapping

import ml_collections


def config_from_dataclass(obj_or_cls, omit: Collection[str] = ()) -> ml_collections.ConfigDict:
  """A ConfigDict with one entry per field (nested dataclasses become nested sections), but
  the dotted fields in `omit` (values derived from other sections, e.g. "demos.answer_protocol")."""
  obj = obj_or_cls() if isinstance(obj_or_cls, type) else obj_or_cls
  out = ml_collections.ConfigDict()
  for f in dataclasses.fields(obj):
    if f.name in omit:
      continue
    value = getattr(obj, f.name)
    if dataclasses.is_dataclass(value):
      inner = [k.split(".", 1)[1] for k in omit if k.startswith(f"{f.name}.")]
      out[f.name] = config_from_dataclass(value, inner)
    elif isinstance(value, tuple):
      out[f.name] = list(value) if not value else value
    else:
      out[f.name] = value
  return out


def dataclass_from_config(cls, section: Mapping[str, Any] | None, where: str = ""):
  """Builds `cls` from a config section; unknown keys and invalid values name the key."""
  section = dict(section or {})
  hints = typing.get_type_hints(cls)
  known = {f.name: f for f in dataclasses.fields(cls)}
  unknown = sorted(set(section) - set(known))
  if unknown:
    raise ValueError(f"{where or cls.__name__}: unknown key(s) {unknown}; valid keys are "
                     f"{sorted(known)}")
  kwargs = {}
  for name, value in section.items():
    key = f"{where}.{name}" if where else name
    default = _field_default(known[name])
    if dataclasses.is_dataclass(default) and isinstance(value, Mapping | ml_collections.ConfigDict):
      value = dataclass_from_config(type(default), value, key)
    elif isinstance(value, list) and hints.get(name) is not None and "tuple" in str(hints[name]):
      value = tuple(value)
    kwargs[name] = value
  try:
    return cls(**kwargs)
  except (ValueError, TypeError) as e:
    raise ValueError(f"{where or cls.__name__}: {e}") from None


def _field_default(f: dataclasses.Field):
  if f.default is not dataclasses.MISSING:
    return f.default
  if f.default_factory is not dataclasses.MISSING:
    return f.default_factory()
  return None


def parse_preset_arg(arg: str | None, allowed: Mapping[str, tuple[str, ...] | None]) -> dict:
  """Parses `"model=tiny,env=toolworld"`; `allowed[key]` lists valid values (None: free)."""
  out: dict[str, str] = {}
  if not arg:
    return out
  for item in arg.split(","):
    item = item.strip()
    if not item:
      continue
    if "=" not in item:
      raise ValueError(f"config argument '{item}': expected key=value (e.g. model=tiny)")
    key, value = (s.strip() for s in item.split("=", 1))
    if key not in allowed:
      raise ValueError(f"config argument: unknown preset key '{key}'; valid keys are "
                       f"{sorted(allowed)}")
    if allowed[key] is not None and value not in allowed[key]:
      raise ValueError(f"config argument {key}={value}: valid values are {list(allowed[key])}")
    out[key] = value
  return out


def get_key(config: Mapping[str, Any], key: str) -> Any:
  """The value of a dotted `key` ("sft.demos.p_confuse") in a ConfigDict or nested dicts."""
  for part in key.split("."):
    config = config[part]
  return config


def set_key(config, key: str, value: Any) -> None:
  """Sets a dotted `key` of a ConfigDict or of nested dicts."""
  parent, _, leaf = key.rpartition(".")
  (get_key(config, parent) if parent else config)[leaf] = value


# -- Presets: named config values, as data ----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Ref:
  """A preset value that follows another key (a live reference: `--config.<key>` moves both),
  e.g. `Ref("rollout.max_steps")` for `rollout.shapes.max_steps`. Assigned as `ref + 0`, so
  that overriding the key that holds it replaces it instead of changing `key` too."""

  key: str


# A computed preset value that leaves its key as it is.
UNCHANGED = type("Unchanged", (), {"__repr__": lambda self: "UNCHANGED"})()


@dataclasses.dataclass(frozen=True)
class Preset:
  """Named config values applied together when the preset argument matches `when`.

  Attributes:
    name: how `--print_config` names the layer ("preset <name>").
    doc: why these values (one paragraph).
    values: {dotted key: value}; a value is a constant, a `Ref`, or a function of the config
      as it stands before the preset (all values are computed first, then assigned), which
      may return `UNCHANGED`.
    when: {preset key: value} that must all hold for the preset to apply (`model`, `env`,
      `smoke`, ...: the settings of the preset argument, defaults included); an environment's
      own presets (`Environment.presets`) apply only to it, so need no `env`.
  """

  name: str
  doc: str
  values: Mapping[str, Any]
  when: Mapping[str, str] = dataclasses.field(default_factory=dict)

  def applies(self, settings: Mapping[str, str]) -> bool:
    return all(settings.get(k) == v for k, v in self.when.items())


def apply_preset(config: ml_collections.ConfigDict, preset: Preset,
                 pinned: Collection[str] = ()) -> None:
  """Assigns `preset`'s values to the (unlocked) `config`, but the keys in `pinned` (set by the
  preset argument itself, e.g. `train.steps` by `steps=`): a named preset never overrides
  what the command's argument says."""
  values = {k: v(config) if callable(v) else v for k, v in preset.values.items()}
  for key, value in values.items():
    if key in pinned or value is UNCHANGED:
      continue
    if isinstance(value, Ref):
      parent, _, leaf = value.key.rpartition(".")
      value = (get_key(config, parent) if parent else config).get_ref(leaf) + 0
    elif isinstance(value, Mapping):
      value = ml_collections.ConfigDict(dict(value))
    set_key(config, key, value)


# -- Descriptions of the options' fields ------------------------------------------------------

_LONGEST = 110  # characters of a description, cut at a word


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
  """{field: one-line description} of the dataclass `cls`: the first sentence of the comment
  on the field's line, else of the comment block just above it, else of its entry in the
  class docstring's "Attributes:" section. A field with none is absent."""
  fields = {f.name for f in dataclasses.fields(cls)}
  source = textwrap.dedent(inspect.getsource(cls))
  comments: dict[int, str] = {}  # line number -> its comment
  for tok in tokenize.generate_tokens(io.StringIO(source).readline):
    if tok.type == tokenize.COMMENT:
      comments[tok.start[0]] = tok.string.lstrip("#").strip()
  lines = source.splitlines()
  out, block = {}, []
  for number, line in enumerate(lines, 1):
    stripped = line.strip()
    if stripped.startswith("#"):
      block.append(comments.get(number, ""))
      continue
    m = re.match(r"(\w+)\s*:", stripped)
    if m and m.group(1) in fields and line.startswith("  ") and not line.startswith("   "):
      text = comments.get(number) or " ".join(block)
      if text:
        out.setdefault(m.group(1), one_line(text))
    block = []
  for name, text in _docstring_attributes(cls.__doc__ or "").items():
    if name in fields and name not in out:
      out[name] = one_line(text)
  return out


def _docstring_attributes(doc: str) -> dict[str, str]:
  """{name: text} of a Google-style docstring's "Attributes:" section."""
  out, names = {}, []
  lines = doc.splitlines()
  try:
    start = next(i for i, line in enumerate(lines) if line.strip() == "Attributes:")
  except StopIteration:
    return out
  indent = None
  for line in lines[start + 1:]:
    if not line.strip():
      continue
    width = len(line) - len(line.lstrip())
    indent = width if indent is None else indent
    if width < indent:
      break
    m = re.match(r"([\w, ]+):\s*(.*)", line.strip())
    if width == indent and m:
      names = [n.strip() for n in m.group(1).split(",")]
      for name in names:
        out[name] = m.group(2)
      continue
    for name in names:
      out[name] += " " + line.strip()
  return out


def one_line(text: str) -> str:
  """The first sentence of `text`, at most `_LONGEST` characters (cut at a word, with "...").
  A sentence ends at a period followed by a capital outside parentheses ("Eq. 3", "e.g. the"
  and "Dr. GRPO" go on)."""
  text = " ".join(text.split())
  depth = 0
  for i, ch in enumerate(text):
    depth += (ch == "(") - (ch == ")")
    if (ch == "." and depth == 0 and re.match(r"\s+[A-Z]", text[i + 1:])
        and not text[:i].endswith("Dr")):
      text = text[:i]
      break
  text = text.rstrip(".")
  if len(text) > _LONGEST:
    text = text[:_LONGEST - 3].rsplit(" ", 1)[0] + "..."
  return text
