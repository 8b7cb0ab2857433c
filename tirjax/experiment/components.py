"""The pieces `experiments/train.py` assembles: model, sampler, judge, query order, run id."""

from __future__ import annotations

import hashlib
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tirjax import rundir
from tirjax.checkpoint import TrainState
from tirjax.env.judge import LLMJudge, LLMJudgeOptions
from tirjax.models import config as model_config
from tirjax.models.decoder import init
from tirjax.models.hf_io import load_hf
from tirjax.episodes.judging import rule_judge
from tirjax.sampling.interface import PolicySampler
from tirjax.sampling.jax_sampler import JaxSampler, JaxSamplerOptions, bucket
from tirjax.sampling.vllm_policy import VLLMPolicySampler


def run_id(config) -> str:
  """A name for the run's identity: its config without the keys a restart may change."""
  flat = rundir.flatten(json.loads(json.dumps(config.to_dict(), default=str)))
  kept = {k: v for k, v in flat.items() if k not in rundir.RESUMABLE_KEYS}
  digest = hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:12]
  return f"{config.advantage.name}-{digest}"


def build_model(model_cfg, vocab_size: int, rules, seed: int):
  """The policy: an HF checkpoint's weights, or a fresh tiny model sized to the tokenizer with
  the sizes of `model.tiny`."""
  if model_cfg.hf_checkpoint:
    return load_hf(model_cfg.hf_checkpoint, rules=rules)
  cfg = model_config.preset(model_cfg.preset)
  if model_cfg.preset == "tiny":
    cfg = model_config.tiny(vocab_size=vocab_size, **model_cfg.get("tiny", {}))
  return init(cfg, seed=seed, rules=rules)


def reference_params(state: TrainState, workdir: str):
  """The KL reference: the policy at the start of RL, saved once in `workdir/reference` so
  that a resumed run keeps the same reference (Orbax writes atomically)."""
  import orbax.checkpoint as ocp
  path = os.path.abspath(os.path.join(workdir, "reference"))
  ckptr = ocp.StandardCheckpointer()
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
  """Copies of the policy's parameters: train steps donate the state's buffers."""
  return jax.tree.map(jnp.copy, state.params)


class QueryOrder:
  """Which training queries step i uses: consecutive slices of epoch-seeded permutations.

  A pure function of the step, so a resumed run draws exactly the queries an uninterrupted
  run would. `extra(i, k)` gives DAPO's refill queries for round k of step i, from a separate
  stream.
  """

  def __init__(self, num_tasks: int, per_step: int, seed: int):
    self.n, self.per_step, self.seed = num_tasks, per_step, seed

  def _take(self, stream: int, start: int, count: int) -> list[int]:
    out = []
    while len(out) < count:
      epoch, offset = divmod(start + len(out), self.n)
      order = np.random.default_rng([self.seed, stream, epoch]).permutation(self.n)
      out.extend(int(q) for q in order[offset:offset + count - len(out)])
    return out

  def step(self, i: int) -> list[int]:
    return self._take(0, i * self.per_step, self.per_step)

  def extra(self, i: int, k: int, count: int) -> list[int]:
    return self._take(1 + k, i * count, count)


def make_judge(judge_cfg):
  """The rule-based verifier, or the LLM judge (five votes, majority) on an endpoint."""
  if judge_cfg.kind == "rule":
    return rule_judge()
  llm = LLMJudge(LLMJudgeOptions(base_url=judge_cfg.base_url, model=judge_cfg.model,
                                 votes=judge_cfg.votes))
  return llm.judge


def make_sampler(config, graphdef, state: TrainState, workdir: str, tokenizer_source: str,
                 rollout_options) -> PolicySampler:
  """The configured sampler, holding the current policy (version `state.policy_version`)."""
  params = sampler_params(state)
  if config.sampler.kind == "jax":
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
        reuse_cache=config.sampler.reuse_cache)
    return JaxSampler(nnx.merge(graphdef, params), options, policy_version=state.policy_version)
  return VLLMPolicySampler(config, graphdef, params, tokenizer_source, workdir)
