"""Load and export Hugging Face checkpoints (config.json + safetensors).

Loading streams: tensors are read one at a time (`safe_open`), converted into the parameter's
dtype and layout, and written into a host buffer for one tirjax parameter (all layers of it),
which goes to the device before the next parameter is read. Peak host memory beyond the model
is one stacked parameter (e.g. 3.8 GB for Llama 3.1 8B's gate_proj in bf16). Every name and
shape is checked against the tables in `hf_mapping` before any tensor is read.

Export writes what `save_pretrained` writes (config.json, `model.safetensors` or numbered
shards with `model.safetensors.index.json`), plus the non-weight files (tokenizer,
generation_config.json, chat template, licence) of a source directory, into a temporary
directory that is renamed into place at the end. Host memory: one shard plus one parameter.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import uuid
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from tirjax.models import decoder, hf_config, hf_mapping
from tirjax.sharding import DEFAULT_RULES, Rules, state_shardings

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".gguf")


class CheckpointMismatch(ValueError):
  """A checkpoint's tensors do not match its config."""


def _weight_map(path: str) -> dict[str, str]:
  """HF tensor name → safetensors file that holds it."""
  index = os.path.join(path, INDEX)
  if os.path.exists(index):
    with open(index) as f:
      weight_map = json.load(f)["weight_map"]
    for file in sorted(set(weight_map.values())):
      if not os.path.exists(os.path.join(path, file)):
        raise CheckpointMismatch(f"{index}: lists {file}, which does not exist")
    return {name: os.path.join(path, file) for name, file in weight_map.items()}
  files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
  if not files:
    raise FileNotFoundError(f"{path}: no *.safetensors files (and no {INDEX})")
  weight_map = {}
  for file in files:
    with safe_open(os.path.join(path, file), "np") as f:
      for name in f.keys():
        weight_map[name] = os.path.join(path, file)
  return weight_map


def _check(path, weight_map, handles, cfg, variables) -> None:
  """Missing, unexpected and misshapen tensors, each named with its file."""
  expected = {}
  for rule in hf_mapping.rules(cfg):
    shape = variables[rule.path].shape[1 if rule.per_layer else 0:]
    for name, _ in hf_mapping.hf_names(rule, cfg.num_layers):
      expected[name] = hf_mapping.hf_shape(rule.kind, shape)
  missing = sorted(set(expected) - set(weight_map))
  if missing:
    raise CheckpointMismatch(
        f"{path}: missing tensor(s) for a {cfg.family} model with {cfg.num_layers} layers: "
        f"{missing[:5]}{' ...' if len(missing) > 5 else ''} ({len(missing)} in all)")
  unexpected = sorted(n for n in weight_map
                      if n not in expected and not hf_mapping.ignored(n, cfg))
  if unexpected:
    name = unexpected[0]
    raise CheckpointMismatch(
        f"{weight_map[name]}: unexpected tensor(s) {unexpected[:5]} for a {cfg.family} model "
        f"(tie_word_embeddings={cfg.tie_word_embeddings}, {cfg.num_layers} layers)")
  for name, shape in expected.items():
    got = tuple(handles[weight_map[name]].get_slice(name).get_shape())
    if got != shape:
      raise CheckpointMismatch(f"{weight_map[name]}: tensor {name!r} has shape {got}, the "
                               f"config implies {shape}")


def load_hf(path: str, *, mesh: Optional[jax.sharding.Mesh] = None,
            rules: Rules = DEFAULT_RULES, **changes) -> decoder.Decoder:
  """A `Decoder` with the weights of the Hugging Face checkpoint directory `path`.

  The family comes from config.json's `model_type`. `changes` override config fields, e.g.
  `param_dtype="float32"` (tensors are cast while loading) or `remat=True`. The model
  constrains its activations by `rules` (`tirjax.sharding`); with `mesh`, parameters are
  placed by them too.

  Raises:
    hf_config.UnsupportedConfig: for a model_type or feature the decoder does not implement.
    CheckpointMismatch: naming the file and tensor that is missing, unexpected or of the
      wrong shape.
  """
  cfg = hf_config.config_from_hf(hf_config.read(path),
                                 where=os.path.join(path, "config.json"), **changes)
  graphdef, state = nnx.split(decoder.abstract(cfg, rules=rules))
  variables = dict(nnx.to_flat_state(state))
  shardings = (None if mesh is None else
               dict(nnx.to_flat_state(state_shardings(state, mesh, rules))))
  weight_map = _weight_map(path)
  with contextlib.ExitStack() as stack:
    handles = {f: stack.enter_context(safe_open(f, "np"))
               for f in sorted(set(weight_map.values()))}
    _check(path, weight_map, handles, cfg, variables)
    for rule in hf_mapping.rules(cfg):
      var = variables[rule.path]
      buf = np.empty(var.shape, jnp.dtype(var.dtype))
      for name, layer in hf_mapping.hf_names(rule, cfg.num_layers):
        target = buf if layer is None else buf[layer]
        x = handles[weight_map[name]].get_tensor(name)
        target[...] = hf_mapping.to_tirjax(rule.kind, x, target.shape).astype(buf.dtype)
        del x, target
      sharding = None if shardings is None else shardings[rule.path].get_value()
      # A copy, completed before the buffer is dropped: one parameter at a time on the host.
      var.set_value(jax.device_put(buf, sharding, may_alias=False).block_until_ready())
      del buf
  return nnx.merge(graphdef, state)


def _plan(model: decoder.Decoder, dtype) -> list[tuple[str, int]]:
  """(HF name, bytes) of every exported tensor, in the order `_tensors` yields them."""
  cfg = model.config
  params = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
  plan = []
  for rule in hf_mapping.rules(cfg):
    shape = params[rule.path].get_value().shape[1 if rule.per_layer else 0:]
    plan += [(name, math.prod(shape) * dtype.itemsize)
             for name, _ in hf_mapping.hf_names(rule, cfg.num_layers)]
  return plan


def _tensors(model: decoder.Decoder, dtype):
  """(HF name, HF-layout numpy array) of every tensor; one parameter on the host at a time."""
  cfg = model.config
  params = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
  for rule in hf_mapping.rules(cfg):
    value = np.asarray(jax.device_get(params[rule.path].get_value())).astype(dtype)
    for name, layer in hf_mapping.hf_names(rule, cfg.num_layers):
      yield name, hf_mapping.to_hf(rule.kind, value if layer is None else value[layer])
    del value


def _shard_sizes(plan, max_shard_bytes: int) -> list[int]:
  """Number of consecutive tensors in each shard."""
  sizes, size = [0], 0
  for _, nbytes in plan:
    if sizes[-1] and size + nbytes > max_shard_bytes:
      sizes.append(0)
      size = 0
    sizes[-1] += 1
    size += nbytes
  return sizes


def _check_destination(out_dir: str, overwrite: bool) -> None:
  if os.path.isdir(out_dir) and os.listdir(out_dir) and not overwrite:
    raise FileExistsError(f"{out_dir}: exists and is not empty; pass overwrite=True to "
                          "replace it")
  if os.path.exists(out_dir) and not os.path.isdir(out_dir):
    raise FileExistsError(f"{out_dir}: exists and is not a directory")


def _write(model, tmp: str, source_dir: Optional[str], dtype: str, max_shard_bytes: int):
  base = None
  if source_dir is not None:
    # A tokenizer-only source (e.g. toolworld's) has no config.json to carry keys over from.
    if os.path.exists(os.path.join(source_dir, "config.json")):
      base = hf_config.read(source_dir)
    for file in sorted(os.listdir(source_dir)):
      src = os.path.join(source_dir, file)
      if (os.path.isfile(src) and file != "config.json" and not file.endswith(INDEX)
          and not file.endswith(_WEIGHT_SUFFIXES)):
        shutil.copy2(src, os.path.join(tmp, file))
  config = hf_config.config_to_hf(model.config, torch_dtype=dtype, base=base)
  with open(os.path.join(tmp, "config.json"), "w") as f:
    json.dump(config, f, indent=2)
  dtype = jnp.dtype(dtype)
  sizes = _shard_sizes(_plan(model, dtype), max_shard_bytes)
  tensors = _tensors(model, dtype)
  weight_map, total = {}, 0
  for k, count in enumerate(sizes):
    file = SINGLE if len(sizes) == 1 else f"model-{k + 1:05d}-of-{len(sizes):05d}.safetensors"
    shard = dict(next(tensors) for _ in range(count))
    save_file(shard, os.path.join(tmp, file), metadata={"format": "pt"})
    total += sum(t.nbytes for t in shard.values())
    weight_map.update({name: file for name in shard})
    del shard
  if len(sizes) > 1:
    with open(os.path.join(tmp, INDEX), "w") as f:
      json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def export_hf(model: decoder.Decoder, out_dir: str, *, source_dir: Optional[str] = None,
              dtype: Optional[str] = None, max_shard_bytes: int = 5 * 2**30,
              overwrite: bool = False) -> str:
  """Write `model` as a Hugging Face checkpoint directory that transformers and vLLM load.

  Args:
    model: the decoder.
    out_dir: destination; must be absent or empty unless `overwrite`.
    source_dir: a checkpoint directory whose config.json keys beyond the architecture (token
      ids, ...) and whose non-weight files (tokenizer, generation_config.json, ...) are
      carried over.
    dtype: "bfloat16" or "float32" for the tensors; default the parameter dtype.
    max_shard_bytes: larger checkpoints are split into shards with an index.
    overwrite: replace a non-empty `out_dir` (atomically: the old directory is removed only
      after the new one is in place).

  Returns:
    `out_dir`.
  """
  dtype = dtype or model.config.param_dtype
  if dtype not in ("bfloat16", "float32"):
    raise ValueError(f"dtype: must be 'bfloat16' or 'float32', got {dtype!r}")
  if max_shard_bytes < 1:
    raise ValueError(f"max_shard_bytes: must be >= 1, got {max_shard_bytes}")
  out_dir = os.path.abspath(out_dir)
  _check_destination(out_dir, overwrite)
  parent, name = os.path.split(out_dir)
  os.makedirs(parent, exist_ok=True)
  tmp = os.path.join(parent, f".{name}.tmp-{uuid.uuid4().hex[:8]}")
  os.mkdir(tmp)
  try:
    _write(model, tmp, source_dir, dtype, max_shard_bytes)
    _check_destination(out_dir, overwrite)
    old = None
    if os.path.isdir(out_dir) and os.listdir(out_dir):
      old = os.path.join(parent, f".{name}.old-{uuid.uuid4().hex[:8]}")
      os.rename(out_dir, old)
    elif os.path.isdir(out_dir):
      os.rmdir(out_dir)
    os.rename(tmp, out_dir)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  if old is not None:
    shutil.rmtree(old)
  return out_dir
