"""The pieces `experiments/train.py` assembles: model, sampler, judge, query order, run id."""

from __future__ import annotations

import hashlib
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tirjax import rundir
from tirjax.checkpoint import TrainState
from tirjax.env.judge import LLMJudge, LLMJudgeOptions
from tirjax.models import config as model_config
from tirjax.models.decoder import init
from tirjax.models.hf_io import export_hf, load_hf
from tirjax.rollout.judging import rule_judge
from tirjax.sampling.jax_sampler import JaxSampler, JaxSamplerOptions, bucket
from tirjax.sampling.teacher import DecoderTeacher


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


# Largest admissible |vLLM − trainer| log-prob gap on the hand-over probe, by compute dtype:
# float32 on both sides agrees to ~1e-5; bfloat16 kernels differ in rounding (an allowance,
# not measured here: vLLM on this CPU machine runs float32).
HANDOVER_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.1}


class VLLMPolicySampler:
  """The vLLM sampler with the trainer's hand-over: export, reload in place, check, tag.

  `update(params, version)` writes the parameters as an HF directory (alternating between two
  folders, so the server never reads a folder being written), has the server reload it, and
  checks vLLM's log-probs on a probe batch against the trainer's own teacher-forced ones
  (`DecoderTeacher`). A run launches its server from the first export (sized to the
  rollout's `shapes.max_tokens`, in the model's compute dtype), or attaches to
  `sampler.vllm_url`, which must serve a model of the same architecture.

  Attributes:
    last_handover: the `HandoverReport` of the last update (timings and the measured gap).
    last_export_s: seconds the last export took.
  """

  def __init__(self, config, graphdef, params, tokenizer_source: str, workdir: str):
    from tirjax.sampling.vllm import VLLMOptions, VLLMSampler
    from tirjax.sampling.vllm_server import ServerOptions
    self._graphdef = graphdef
    self._dirs = [os.path.join(workdir, "vllm_weights", f"slot{k}") for k in (0, 1)]
    self._slot = 0
    self._tokenizer_source = tokenizer_source
    self._teacher = DecoderTeacher(graphdef, params, config.model.logprob_chunk)
    model_cfg = nnx.merge(graphdef, params).config
    tolerance = HANDOVER_TOLERANCE[model_cfg.dtype]
    first = self._export(params)
    if config.sampler.vllm_url:
      options = VLLMOptions(url=config.sampler.vllm_url, handover_tolerance=tolerance)
    else:
      server = ServerOptions(
          model=first, dtype=model_cfg.dtype, max_model_len=config.rollout.shapes.max_tokens,
          kv_cache_memory_bytes=config.sampler.vllm_kv_cache_mib << 20,
          **({"python": config.sampler.vllm_python} if config.sampler.vllm_python else {}))
      options = VLLMOptions(server=server, handover_tolerance=tolerance)
    self._sampler = VLLMSampler(options)
    self.policy_version = 0
    self.last_handover = None

  @property
  def sampler(self):
    """The underlying `VLLMSampler`."""
    return self._sampler

  def _export(self, params) -> str:
    t0 = time.perf_counter()
    out = self._dirs[self._slot]
    self._slot = 1 - self._slot
    export_hf(nnx.merge(self._graphdef, params), out, source_dir=self._tokenizer_source,
              overwrite=True)
    self._teacher.set_params(params)
    self.last_export_s = time.perf_counter() - t0
    return out

  def update(self, params, policy_version: int) -> None:
    """Hands `params` to the server as `policy_version` (a no-op if it already holds it).

    Raises:
      WeightMismatchError: vLLM's log-probs differ from the trainer's by more than the
        tolerance; the message gives the measured gap.
    """
    if policy_version == self.policy_version and self.last_handover is not None:
      return
    path = self._export(params)
    self.last_handover = self._sampler.load_weights(path, version=policy_version,
                                                    teacher_logprobs=self._teacher)
    self.policy_version = policy_version

  def generate(self, prompts, params):
    return self._sampler.generate(prompts, params)

  def close(self) -> None:
    self._sampler.close()


def make_sampler(config, graphdef, state: TrainState, workdir: str, tokenizer_source: str,
                 rollout_options):
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
