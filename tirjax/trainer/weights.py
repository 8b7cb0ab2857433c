"""The policy's parameters in a run: the model built or loaded, the KL reference kept across
restarts, and the copies handed to the sampler."""

from __future__ import annotations

import os

import jax

from tirjax import distributed, rundir
from tirjax.checkpoint import TrainState
from tirjax.models import config as model_config
from tirjax.models.decoder import init
from tirjax.models.hf_io import load_hf


def build_model(model_cfg, vocab_size: int, rules, seed: int):
  """The policy: an HF checkpoint's weights, or a fresh tiny model sized to the tokenizer with
  the sizes of `model.tiny`."""
  if model_cfg.hf_checkpoint:
    return load_hf(model_cfg.hf_checkpoint, rules=rules)
  cfg = model_config.preset(model_cfg.preset)
  if model_cfg.preset == "tiny":
    cfg = model_config.tiny(vocab_size=vocab_size, **dict(model_cfg.tiny))
  return init(cfg, seed=seed, rules=rules)


def reference_params(state: TrainState, workdir: str):
  """The KL reference: the policy at the start of RL, saved once in `workdir/reference` so
  that a resumed run keeps the same reference (Orbax writes atomically)."""
  import orbax.checkpoint as ocp
  path = os.path.abspath(os.path.join(workdir, rundir.REFERENCE))
  ckptr = ocp.StandardCheckpointer()
  distributed.barrier("reference")  # every process looks before any has saved
  if os.path.exists(path):
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, state.params)
    params = ckptr.restore(path, target)
  else:
    ckptr.save(path, state.params)
    ckptr.wait_until_finished()
    params = state.params
  ckptr.close()
  return params


def sampler_params(state: TrainState):
  """Copies of the policy's parameters (train steps donate the state's buffers), whole on this
  process when the run has several (each process's sampler decodes alone)."""
  return distributed.local_replica(state.params)
