"""What bounds an RL step's speed-up, from the phases `benchmarks.bench_rl_step` measures."""

from __future__ import annotations


def limits(out: dict) -> dict:
  """What bounds the targets, from the measured phases (the step's profile):

  * `step_speedup_bound`: the re-prefill step over the cached step without its rollout — the
    speed-up even a free rollout would give (Amdahl): the update, reference log-probs,
    advantages and hand-over are untouched by the cache;
  * `decode_efficiency`: the episodes' decode alone (generated tokens per second of decode
    time) over raw decode at the same bucket;
  * `sampler_time_shares`: prefill (tool responses and new prompts), decode, and the rest
    (host work between sampler calls) of the cached path's sampler time.
  """
  old, new = out["variants"]["re-prefill"], out["variants"]["prefix cache"]
  outside = new["time/step_s"] - new["time/rollout_s"]
  other = new["time/sampler_s"] - new["time/prefill_s"] - new["time/decode_s"]
  return {
      "step_speedup_bound": old["time/step_s"] / outside,
      "cached_step_outside_rollout_s": outside,
      "cached_step_shares": {k: new[f"time/{k}_s"] / new["time/step_s"] for k in (
          "rollout", "update", "reference", "handover", "advantages")},
      "decode_efficiency": (new["tokens/decode"] / new["time/decode_s"])
                           / out["raw_decode_tokens_per_s"],
      "sampler_time_shares": {"prefill": new["time/prefill_s"] / new["time/sampler_s"],
                              "decode": new["time/decode_s"] / new["time/sampler_s"],
                              "other": other / new["time/sampler_s"]}}
