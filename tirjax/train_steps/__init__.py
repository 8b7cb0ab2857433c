"""Train steps: the jitted, mesh-sharded policy (RL) and SFT updates and what they need.

  optimizer  OptimizerOptions, make_optimizer (clip → AdamW, warmup + constant / cosine)
  batches    PolicyBatch / SFTBatch (what a step reads), micro-batch split
  sft        SFTLossOptions, masked next-token cross-entropy
  step       StepOptions, Placement, init_state, TrainStep (the padded steps)
  forest, packing, packed, packed_sft
             a query group's rows as one token trie, packed into bucketed sequences by a
             token budget; the packed policy step and log-prob pass, the packed SFT step
  steps      policy_step and sft_step: the RL and SFT steps, padded or packed
             (`StepOptions.packed`)
  minibatches  PPO passes over a rollout batch's query groups (update_passes)
  reference  ReferencePolicy, with_reference_logprobs (the KL term's log-probs, β > 0 only);
             TokenLogprobs, with_policy_logprobs (π_old recomputed by the trainer)
  flops      model FLOPs per step and MFU
"""

from tirjax.train_steps.batches import PolicyBatch, SFTBatch, policy_batch
from tirjax.train_steps.optimizer import OptimizerOptions, learning_rate, make_optimizer
from tirjax.train_steps.reference import (ReferencePolicy, TokenLogprobs, with_policy_logprobs,
                                      with_reference_logprobs)
from tirjax.train_steps.sft import SFTLossOptions
from tirjax.train_steps.steps import policy_step, sft_step
from tirjax.train_steps.step import (Placement, StepOptions, TrainStep, init_state, placement,
                                  split_model)

__all__ = ["OptimizerOptions", "Placement", "PolicyBatch", "ReferencePolicy", "SFTBatch",
           "SFTLossOptions", "StepOptions", "TrainStep", "init_state", "learning_rate",
           "make_optimizer", "placement", "policy_batch", "policy_step", "sft_step",
           "split_model", "TokenLogprobs", "with_policy_logprobs", "with_reference_logprobs"]
