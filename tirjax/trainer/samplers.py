"""The configured sampler (spec §7): the built-in JAX sampler, or vLLM behind the
`PolicySampler` protocol."""

from __future__ import annotations

import dataclasses
import os

import jax
from flax import nnx

from tirjax import distributed
from tirjax.checkpoint import TrainState
from tirjax.trainer.weights import sampler_params
from tirjax.trainer.options import SamplerOptions
from tirjax.sampling.interface import PolicySampler
from tirjax.sampling.jax_sampler import JaxSampler, JaxSamplerOptions, bucket
from tirjax.sampling.vllm_policy import VLLMPolicySampler

# The smallest prompt bucket of a long context: toolworld's (512) and below, every prompt is
# padded to the context; a 16,384-token context compiles at most 5 prompt buckets.
PROMPT_FLOOR = 1024


def make_sampler(options: SamplerOptions, logprob_chunk_size: int, graphdef, state: TrainState,
                 workdir: str, tokenizer_source: str, rollout_options) -> PolicySampler:
  """The configured sampler, holding the current policy (version `state.policy_version`);
  vLLM's log-probs of the trainer's policy are taken `logprob_chunk_size` positions at a time."""
  params = sampler_params(state)
  if options.kind == "jax":
    # Buckets as large as a batch's rows and context: a run compiles a handful of executables
    # (tree candidates can double the rows) instead of one per prompt length met. Prompts get
    # their own bucket (a step's first call prefills queries_per_step prompts, not its rows),
    # and continued rows a suffix bucket that holds a tool response. Long contexts take fewer
    # rows per call: as many as the prefill's attention scores fit in `attention_budget()`;
    # their prompts are padded to their own power of two above `PROMPT_FLOOR` tokens, not all
    # to the context (attention costs the square of the padded length).
    shapes = rollout_options.shapes
    model = nnx.merge(graphdef, params)
    prompt_len = bucket(shapes.max_tokens - rollout_options.max_new_tokens, 1)
    fit = prefill_rows(model.config.num_heads, prompt_len, attention_budget())
    max_batch = min(bucket(max(256, 2 * shapes.num_rows), 1), fit)
    options = JaxSamplerOptions(
        min_batch=min(bucket(shapes.num_rows, 1), max_batch), max_batch=max_batch,
        min_decode_rows=min(8, max_batch), min_prompts=1,
        min_prompt_len=min(prompt_len, PROMPT_FLOOR),
        min_new_tokens=bucket(rollout_options.max_new_tokens, 1),
        min_suffix_len=bucket(rollout_options.max_new_tokens, 16),
        reuse_cache=options.reuse_cache)
    return JaxSampler(model, options, policy_version=state.policy_version)
  if distributed.is_multiprocess():  # each process hands its weights to its own servers
    workdir = os.path.join(workdir, f"process{jax.process_index()}")
    if options.vllm_url:
      urls = own_servers(options.vllm_url.split(","), jax.process_index(), jax.process_count())
      options = dataclasses.replace(options, vllm_url=",".join(urls))
  return VLLMPolicySampler(options, logprob_chunk_size, rollout_options.shapes, graphdef, params,
                           tokenizer_source, workdir)


def prefill_rows(num_heads: int, prompt_len: int, budget_bytes: int) -> int:
  """The most rows (a power of two, at least 1) whose prefill attention scores, float32
  `[rows, num_heads, prompt_len, prompt_len]` (`models.layers.Attention.attend`), fit in
  `budget_bytes`; the softmax's probabilities and the mask about double the peak."""
  per_row = 4 * num_heads * prompt_len * prompt_len
  rows = max(1, budget_bytes // per_row)
  return 1 << (rows.bit_length() - 1)


def attention_budget() -> int:
  """An eighth of the memory of this process's first device (on the CPU, of the host): what
  one prefill call's attention scores may take. On a 24 GB host 3 GB: 256 rows of 512 tokens,
  2 rows of 8,192 (toolworld's, ToolHop's contexts on the tiny model)."""
  stats = jax.local_devices()[0].memory_stats() or {}
  total = stats.get("bytes_limit") or os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  return int(total) // 8


def own_servers(urls: list[str], process: int, processes: int) -> list[str]:
  """The servers process `process` of `processes` samples from: every `processes`-th URL of
  the list, from its own index on (each process hands its weights to its own servers)."""
  mine = [u.strip() for u in urls[process::processes]]
  if not mine:
    raise ValueError(f"sampler.vllm_url: {len(urls)} server(s) for {processes} processes; give "
                     "each process at least one (process p takes URLs p, p + processes, ...)")
  return mine
