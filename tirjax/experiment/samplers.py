"""The configured sampler (SPEC §7): the built-in JAX sampler, or vLLM behind the
`PolicySampler` protocol."""

from __future__ import annotations

from flax import nnx

from tirjax.checkpoint import TrainState
from tirjax.experiment.policy import sampler_params
from tirjax.experiment.sections import ModelOptions, SamplerOptions
from tirjax.sampling.interface import PolicySampler
from tirjax.sampling.jax_sampler import JaxSampler, JaxSamplerOptions, bucket
from tirjax.sampling.vllm_policy import VLLMPolicySampler


def make_sampler(options: SamplerOptions, model: ModelOptions, graphdef, state: TrainState,
                 workdir: str, tokenizer_source: str, rollout_options) -> PolicySampler:
  """The configured sampler, holding the current policy (version `state.policy_version`)."""
  params = sampler_params(state)
  if options.kind == "jax":
    # Buckets as large as a batch's rows and context: a run compiles a handful of executables
    # (tree candidates can double the rows) instead of one per prompt length met. Prompts get
    # their own bucket (a step's first call prefills queries_per_step prompts, not its rows),
    # and continued rows a suffix bucket that holds a tool response.
    shapes = rollout_options.shapes
    options = JaxSamplerOptions(
        min_batch=bucket(shapes.num_rows, 1), max_batch=bucket(max(256, 2 * shapes.num_rows), 1),
        min_prompts=1,
        min_prompt_len=bucket(shapes.max_tokens - rollout_options.max_new_tokens, 1),
        min_new_tokens=bucket(rollout_options.max_new_tokens, 1),
        min_suffix_len=bucket(rollout_options.max_new_tokens, 16),
        reuse_cache=options.reuse_cache)
    return JaxSampler(nnx.merge(graphdef, params), options, policy_version=state.policy_version)
  return VLLMPolicySampler(options, model.logprob_chunk, rollout_options.shapes, graphdef, params,
                           tokenizer_source, workdir)
