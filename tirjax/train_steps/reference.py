"""The frozen reference policy of the KL term (spec §5): its log-probs, once per batch.

    reference = (ReferencePolicy(graphdef, ref_params, place, step_opts)
                 if loss_opts.kl_coef > 0 else None)
    rollouts = with_reference_logprobs(rollouts, reference, loss_opts)   # before policy_batch
    rollouts = with_policy_logprobs(rollouts, TokenLogprobs(graphdef, place, step_opts),
                                    state.params)   # π_old the trainer's own (optional)

With β = 0 (PORTool) nothing is computed and no reference copy of the weights is needed.
The log-probs use the policy step's chunking, micro-batching and temperature, so that
`ref − logp` compares the same distributions. On the packed path (`step.packed`) both
passes fill the generated tokens (`loss_mask`) only, 0 elsewhere, as the samplers' own
`old_logprobs` are: nothing reads them elsewhere (the loss masks them).
"""

from __future__ import annotations

from typing import Optional

import jax
from flax import nnx

from tirjax.loss.objective import LossOptions
from tirjax.models.logprobs import token_logprobs
from tirjax.rollouts import Rollouts
from tirjax.train_steps.batches import merge_microbatches, split_microbatches
from tirjax.train_steps.packed import PackedLogprobs
from tirjax.train_steps.step import Placement, StepOptions, placed_copy


class TokenLogprobs:
  """`(params, tokens, token_valid, group_id) -> [B, L]` log-probs under `params`, with the
  policy step's chunking, micro-batching and temperature; `jitted` is the compiled function.
  With `opts.packed` each query group (`group_id`, then required) is forwarded once as a
  packed forest (`tirjax.train_steps.packed.PackedLogprobs`): the same log-probs."""

  def __init__(self, graphdef: nnx.GraphDef, place: Placement, opts: StepOptions = StepOptions()):
    self.placement = place
    self.packed = PackedLogprobs(graphdef, place, opts) if opts.packed else None

    def logprobs(params, tokens, token_valid):
      model = nnx.merge(graphdef, params)

      def one(mb):
        return token_logprobs(model, mb[0], mb[1], chunk_size=opts.logprob_chunk_size,
                              temperature=opts.temperature)[0]

      mbs = split_microbatches((tokens, token_valid), opts.num_microbatches)
      return merge_microbatches(jax.lax.map(one, mbs))

    self.jitted = jax.jit(logprobs, in_shardings=(place.params, place.batch, place.batch),
                          out_shardings=place.batch)

  @property
  def packer(self):
    """The packed pass's `Packer` (its sizes are resumable state); None when padded."""
    return None if self.packed is None else self.packed.packer

  def __call__(self, params: nnx.State, tokens: jax.Array, token_valid: jax.Array,
               group_id: Optional[jax.Array] = None, needed: Optional[jax.Array] = None
               ) -> jax.Array:
    """`needed [B, L]`: the tokens whose log-probs are wanted; the packed pass computes
    those only (0 elsewhere), the padded one every token."""
    if self.packed is not None:
      if group_id is None:
        raise ValueError("group_id: the packed log-prob pass (step.packed) needs each row's "
                         "query group")
      return self.packed(params, tokens, token_valid, group_id, needed)
    tokens, token_valid = jax.device_put((tokens, token_valid), self.placement.batch)
    with jax.set_mesh(self.placement.mesh):
      return self.jitted(params, tokens, token_valid)


class ReferencePolicy:
  """Log-probs `[B, L]` of token batches under fixed parameters.

  Holds its own copy of `params` (placed like the policy's), since the policy step donates
  the policy's arrays.
  """

  def __init__(self, graphdef: nnx.GraphDef, params: nnx.State, place: Placement,
               opts: StepOptions = StepOptions()):
    self.placement = place
    self.params = placed_copy(params, place.params)
    self.fn = TokenLogprobs(graphdef, place, opts)

  @property
  def packer(self):
    return self.fn.packer

  def logprobs(self, tokens: jax.Array, token_valid: jax.Array,
               group_id: Optional[jax.Array] = None, needed: Optional[jax.Array] = None
               ) -> jax.Array:
    return self.fn(self.params, tokens, token_valid, group_id, needed)


def with_policy_logprobs(rollouts: Rollouts, logprobs: TokenLogprobs, params: nnx.State
                         ) -> Rollouts:
  """`rollouts` whose `old_logprobs` are the trainer's own, under the current (the
  sampler's) parameters at the step's temperature: π_old as the loss computes π, so the
  first update's ratio is 1 whatever the sampler reports (verl's actor recomputes them so).
  Needed when the policy is the tempered one (`train.tempered_policy`): the samplers report
  the raw model's log-probs."""
  return rollouts.replace(old_logprobs=logprobs(params, rollouts.tokens, rollouts.token_valid,
                                                rollouts.group_id, rollouts.loss_mask))


def with_reference_logprobs(rollouts: Rollouts, reference: Optional[ReferencePolicy],
                            loss_opts: LossOptions) -> Rollouts:
  """`rollouts` with `ref_logprobs` filled when the KL weight β > 0; unchanged (and nothing
  computed) when β = 0."""
  if loss_opts.kl_coef == 0:
    return rollouts
  if reference is None:
    raise ValueError(f"reference: a ReferencePolicy is required when kl_coef > 0 "
                     f"(kl_coef={loss_opts.kl_coef})")
  return rollouts.replace(ref_logprobs=reference.logprobs(rollouts.tokens, rollouts.token_valid,
                                                          rollouts.group_id, rollouts.loss_mask))
