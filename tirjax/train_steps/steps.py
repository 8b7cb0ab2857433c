"""The RL and SFT steps, padded or packed (`StepOptions.packed`): one name for each, in a module
of its own because the packed steps build on the padded steps' module (`step` ← `packed`)."""

from __future__ import annotations

import optax
from flax import nnx

from tirjax.loss import objective
from tirjax.train_steps import sft as sft_lib
from tirjax.train_steps.packed import PackedPolicyStep
from tirjax.train_steps.packed_sft import PackedSFTStep
from tirjax.train_steps.step import (Placement, StepOptions, TrainStep, padded_sft_step,
                                     policy_loss_fn)


def policy_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, place: Placement,
                loss_opts: objective.LossOptions = objective.LossOptions(),
                opts: StepOptions = StepOptions()) -> TrainStep:
  """The RL step on `PolicyBatch`es. With `loss_opts.kl_coef > 0` the batch must carry
  `ref_logprobs` (see `tirjax.train_steps.reference`). With `opts.packed` the step takes the
  packed batches its `prepare` makes (`tirjax.train_steps.packed`)."""
  if opts.packed:
    return PackedPolicyStep(graphdef, tx, place, loss_opts, opts)
  return TrainStep(graphdef, tx, policy_loss_fn(loss_opts, opts), place, opts.num_microbatches)


def sft_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, place: Placement,
             sft_opts: sft_lib.SFTLossOptions = sft_lib.SFTLossOptions(),
             opts: StepOptions = StepOptions()) -> TrainStep:
  """The supervised warm-start step on `SFTBatch`es (the same accumulation and optimizer as
  RL's). With `opts.packed` it packs each batch's demonstrations as forests on the host
  (`tirjax.train_steps.packed_sft`)."""
  if opts.packed:
    return PackedSFTStep(graphdef, tx, place, sft_opts, opts)
  return padded_sft_step(graphdef, tx, place, sft_opts, opts)
