"""The vLLM sampler as the trainer drives it: each new policy exported, reloaded, checked.

(`tirjax.sampling.vllm.VLLMSampler` is the client of one server; this adapter adds the
trainer's side of the hand-over, spec §7.)
"""

from __future__ import annotations

import dataclasses
import os
import time

from flax import nnx

from tirjax.models.hf_io import export_hf
from tirjax.sampling.teacher import DecoderTeacher


# Largest admissible |vLLM − trainer| log-prob gap on the hand-over probe, by compute dtype:
# float32 on both sides agrees to ~1e-5; bfloat16 kernels differ in rounding (an allowance,
# not measured here: vLLM on this CPU machine runs float32).
HANDOVER_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.1}
# ... and a server in another dtype than the trainer's (`sampler.vllm_dtype`: bfloat16 under a
# float32 trainer): after 150 SFT steps of the tiny toolworld model the hand-over probe's gap
# reached 0.18 (mean 0.012 over its 64 tokens), above bfloat16's allowance, and the sampled
# tokens' gap 0.16 (`vllm` in benchmarks/results/rollout_correction.json).
MIXED_DTYPE_TOLERANCE = 0.5


class VLLMPolicySampler:
  """The vLLM sampler with the trainer's hand-over: export, reload in place, check, tag.

  `update(params, version)` writes the parameters as an HF directory (alternating between two
  folders, so the server never reads a folder being written), has the server reload it, and
  checks vLLM's log-probs on a probe batch against the trainer's own teacher-forced ones
  (`DecoderTeacher`). A run launches its server from the first export (sized to the
  rollout's `shapes.max_tokens`, in the model's compute dtype or `sampler.vllm_dtype`, with
  the looser `MIXED_DTYPE_TOLERANCE` where the two differ), or attaches to
  `sampler.vllm_url`, which must serve a model of the same architecture.

  Attributes:
    last_handover: the `HandoverReport` of the last update (timings and the measured gap).
    last_export_s: seconds the last export took.
  """

  def __init__(self, sampler_options, logprob_chunk_size: int, shapes, graphdef, params,
               tokenizer_source: str, workdir: str):
    """`sampler_options`: the run's `SamplerOptions` (`sampler.*`); `shapes`: the rollout's
    `Shapes`; `logprob_chunk_size`: the run's `step.logprob_chunk_size`, for the
    teacher-forced log-probs."""
    from tirjax.sampling.vllm import VLLMOptions, VLLMSampler
    from tirjax.sampling.vllm_fleet import VLLMFleet
    from tirjax.sampling.vllm_server import ServerOptions
    self._graphdef = graphdef
    self._dirs = [os.path.join(workdir, "vllm_weights", f"slot{k}") for k in (0, 1)]
    self._slot = 0
    self._tokenizer_source = tokenizer_source
    self._teacher = DecoderTeacher(graphdef, params, logprob_chunk_size)
    model_cfg = nnx.merge(graphdef, params).config
    dtype = sampler_options.vllm_dtype or model_cfg.dtype  # the launched servers'
    tolerance = (HANDOVER_TOLERANCE[dtype] if dtype == model_cfg.dtype
                 else MIXED_DTYPE_TOLERANCE)
    first = self._export(params)
    if sampler_options.vllm_url:
      members = [VLLMOptions(url=u.strip(), handover_tolerance=tolerance)
                 for u in sampler_options.vllm_url.split(",")]
    else:
      server = ServerOptions(
          model=first, dtype=dtype, max_model_len=shapes.max_tokens,
          kv_cache_memory_bytes=sampler_options.vllm_kv_cache_mib << 20,
          gpu_memory_utilization=sampler_options.vllm_gpu_memory_utilization or None,
          # A whole batch's prompts in one engine step: no prefill is split (which vLLM's CPU
          # build cannot do for seeded requests, see ServerOptions).
          max_num_batched_tokens=min(2 * shapes.num_rows * shapes.max_tokens, 1 << 18),
          extra_args=("--enable-sleep-mode",) if sampler_options.vllm_sleep_level else (),
          **({"python": sampler_options.vllm_python} if sampler_options.vllm_python else {}))
      # Each server's output goes to the run directory, next to what it explains.
      members = [VLLMOptions(server=dataclasses.replace(
                     server, log_path=os.path.join(workdir, "vllm_logs", f"server{k}.log")),
                             handover_tolerance=tolerance)
                 for k in range(sampler_options.vllm_servers)]
    self._sampler = VLLMSampler(members[0]) if len(members) == 1 else VLLMFleet(members)
    self._sleep_level = sampler_options.vllm_sleep_level
    self.policy_version = 0
    self.last_handover = None

  @property
  def sampler(self):
    """The underlying `VLLMSampler`, or `VLLMFleet` for several servers."""
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

  def sleep(self) -> None:
    """Between sampling and training: the servers free their accelerator memory when
    `sampler.vllm_sleep_level` > 0 (woken by the next hand-over or sampling call)."""
    if self._sleep_level:
      self._sampler.sleep(self._sleep_level)

  def close(self) -> None:
    self._sampler.close()
