"""The policy's parameters in a run: the model built or loaded, the KL reference kept across
restarts, and the copies handed to the sampler."""

from __future__ import annotations

import os

from tirjax import distributed, rundir
from tirjax.checkpoint import Checkpointer, CheckpointOptions, TrainState
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


def reference_params(state: TrainState, workdir: str, run: Checkpointer):
  """The KL reference: the policy at the start of RL, saved once in `workdir/reference` so
  that a resumed run keeps the same reference. It is a checkpoint of the run like the others
  (`Checkpointer`: atomic, SHA-256 sums verified on restore), so a corrupt reference stops the
  run by name instead of anchoring its KL term elsewhere.

  `run` is the run's own checkpointer: its save in the background (the state as RL starts)
  is waited for first. Orbax names its multi-process barriers by operation, not by manager, so
  two managers finalising at once collide ("Barrier ... is already ongoing") and abort both
  processes.

  Raises:
    CheckpointCorrupt: the saved reference fails its sums or cannot be read.
  """
  path = os.path.join(workdir, rundir.REFERENCE)
  run.wait()
  distributed.barrier("reference")  # every process looks before any has saved
  reference = TrainState(step=0, params=state.params, opt_state={}, rng=state.rng,
                         data_position={}, policy_version=state.policy_version)
  with Checkpointer(path, run.run_id, CheckpointOptions(max_to_keep=1, async_save=False)) as ckpt:
    if ckpt.latest_step() is None:
      ckpt.save(reference)
      return state.params
    return ckpt.restore(reference, step=0).params


def sampler_params(state: TrainState):
  """Copies of the policy's parameters (train steps donate the state's buffers), whole on this
  process when the run has several (each process's sampler decodes alone)."""
  return distributed.local_replica(state.params)
