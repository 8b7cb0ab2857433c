"""The RL step, padded or packed (`StepOptions.packed`): one name for both, in a module of its
own because the packed step builds on the padded step's module (`step` ← `packed`)."""

from __future__ import annotations

import optax
from flax import nnx

from tirjax.loss import objective
from tirjax.train_steps.packed import PackedPolicyStep
from tirjax.train_steps.step import Placement, StepOptions, TrainStep, policy_loss_fn


def policy_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, place: Placement,
                loss_opts: objective.LossOptions = objective.LossOptions(),
                opts: StepOptions = StepOptions()) -> TrainStep:
  """The RL step on `PolicyBatch`es. With `loss_opts.kl_coef > 0` the batch must carry
  `ref_logprobs` (see `tirjax.train_steps.reference`). With `opts.packed` the step takes the
  packed batches its `prepare` makes (`tirjax.train_steps.packed`)."""
  if opts.packed:
    return PackedPolicyStep(graphdef, tx, place, loss_opts, opts)
  return TrainStep(graphdef, tx, policy_loss_fn(loss_opts, opts), place, opts.num_microbatches)
