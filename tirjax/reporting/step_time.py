"""A step-time model of one RL step at paper scale (a roofline estimate, not a measurement):
what a step samples, trains and hands over, and how long that takes on a number of H200s or
TPU v5p chips; `experiments.studies.step_time` prints it as a table. Every constant is named
below with its source; the modelled step is described in that study's docstring.
"""

from __future__ import annotations

import dataclasses
import math

from tirjax.models import config as model_config
from tirjax.models import decoder
from tirjax.train_steps import flops


# -- Constants and where they come from -----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Chip:
  name: str
  peak_flops: float  # dense bf16 FLOP/s (vendor peak)
  hbm_bytes_per_s: float  # vendor peak memory bandwidth
  hbm_bytes: float  # memory capacity
  source: str


CHIPS = {
    "h200": Chip("NVIDIA H200 SXM", 989e12, 4.8e12, 141e9,
                 "NVIDIA H200 datasheet: 989 TFLOP/s dense BF16, 4.8 TB/s, 141 GB HBM3e"),
    "tpu_v5p": Chip("TPU v5p", 459e12, 2.765e12, 95e9,
                    "Google Cloud TPU v5p docs: 459 TFLOP/s BF16, 2,765 GB/s, 95 GB HBM2e"),
}
# Assumptions (no GPU or TPU measurement exists in benchmarks/results/ yet, see issue 19):
TRAIN_MFU = 0.40  # dense LLM training; PaLM reports 46 % (Chowdhery et al. 2022, Table 3)
DECODE_BANDWIDTH_FRACTION = 0.6  # share of peak HBM bandwidth a batched decode step attains
HANDOVER_BYTES_PER_S = 2e9  # safetensors written and read back on a local NVMe disk
# Measured here (benchmarks/results/bench_rl_step_cpu.json, tiny model, 2-core CPU, JAX
# sampler with its prefix cache): generated tokens per second of sampler time in episodes over
# raw decode at the same batch (0.29-0.32); the rest is tool-response prefill and rows that
# wait in half-empty buckets. Applied to the roofline decode rate below.
EPISODE_EFFICIENCY = 0.30
BYTES_PER_PARAM = 2  # bf16 weights and KV cache


@dataclasses.dataclass(frozen=True)
class Workload:
  model: str = "qwen3_1p7b"
  queries: int = 256  # queries per step (the papers' batch)
  rows: int = 16  # rows per query (HiDiffTIR's group; PORTool's n = 8 trees give about 8)
  context: int = 8192  # tokens per row at the end of its episode (prompt + steps + tools)
  prompt_fraction: float = 0.125  # of `context`: the system prompt, tool specs and question
  tool_fraction: float = 0.375  # of `context`: tool responses (prefilled, not sampled)
  kl: bool = True  # a reference forward pass for the KL term

  def __post_init__(self):
    for name in ("queries", "rows", "context"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
    if not (0 <= self.prompt_fraction and 0 <= self.tool_fraction
            and self.prompt_fraction + self.tool_fraction < 1):
      raise ValueError("prompt_fraction, tool_fraction: must be >= 0 and sum to less than 1, got "
                       f"{self.prompt_fraction}, {self.tool_fraction}")


def estimate(w: Workload, chip: Chip, chips: int) -> dict:
  """The step's sizes and times (seconds) for `w` on `chips` chips of kind `chip`."""
  if chips < 1:
    raise ValueError(f"chips: must be >= 1, got {chips}")
  cfg = model_config.preset(w.model)
  params = decoder.num_params(decoder.abstract(cfg))
  n_matmul = flops.matmul_params(cfg)
  rows = w.queries * w.rows
  prompt = round(w.prompt_fraction * w.context)
  tools = round(w.tool_fraction * w.context)
  sampled_per_row = w.context - prompt - tools
  sampled = rows * sampled_per_row
  prefilled = w.queries * prompt + rows * tools  # each query's prompt once (prefix cache)
  trained = rows * w.context

  # Training: PaLM's model FLOPs per token at the mean context of a token (half the row).
  per_token = flops.train_flops_per_token(cfg, w.context // 2)
  train_flops = trained * per_token
  reference_flops = trained * per_token / 3 if w.kl else 0.0  # a forward pass: a third
  train_s = (train_flops + reference_flops) / (chips * chip.peak_flops * TRAIN_MFU)

  # Sampling: each decode step reads the weights once for the whole batch and every row's KV
  # cache; rows are spread over the chips, as many as their KV caches fit beside the weights.
  weight_bytes = params * BYTES_PER_PARAM
  kv_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * BYTES_PER_PARAM
  mean_kv_tokens = prompt + (sampled_per_row + tools) / 2
  free = chips * chip.hbm_bytes * 0.9 - chips * weight_bytes
  if free <= 0:
    raise ValueError(f"{w.model}: its weights ({weight_bytes / 1e9:.1f} GB per chip) do not fit "
                     f"{chip.name}'s {chip.hbm_bytes / 1e9:.0f} GB")
  concurrent = max(1, min(rows, int(free // (kv_per_token * w.context))))
  waves = math.ceil(rows / concurrent)
  per_chip = math.ceil(concurrent / chips)
  step_bytes = weight_bytes + per_chip * mean_kv_tokens * kv_per_token
  step_s = max(step_bytes / (chip.hbm_bytes_per_s * DECODE_BANDWIDTH_FRACTION),
               2 * n_matmul * per_chip / chip.peak_flops)
  raw_tokens_per_s = chips * per_chip / step_s
  decode_s = waves * sampled_per_row * step_s / EPISODE_EFFICIENCY
  prefill_s = 2 * n_matmul * prefilled / (chips * chip.peak_flops * TRAIN_MFU)
  sample_s = decode_s + prefill_s

  handover_bytes = weight_bytes
  handover_s = handover_bytes / HANDOVER_BYTES_PER_S
  return {
      "model": w.model, "params": params, "matmul_params": n_matmul, "chip": chip.name,
      "chips": chips, "rows": rows, "context": w.context,
      "tokens_sampled": sampled, "tokens_prefilled": prefilled, "tokens_trained": trained,
      "train_flops": train_flops + reference_flops,
      "concurrent_rows": concurrent, "decode_waves": waves,
      "sampler_tokens_per_s": EPISODE_EFFICIENCY * raw_tokens_per_s,
      # The throughput at which sampling takes as long as training and hand-over together.
      "sampler_tokens_per_s_needed_for_half_the_step": sampled / (train_s + handover_s),
      "handover_bytes": handover_bytes,
      "seconds": {"sample": sample_s, "train": train_s, "handover": handover_s,
                  "step": sample_s + train_s + handover_s},
  }


def async_estimate(w: Workload, chip: Chip, chips: int) -> dict:
  """The step with k-step off-policy rollouts (`train.max_staleness` >= 1) on `chips` chips
  split between a sampler (s chips) and a learner (the other chips − s): step t + k is sampled
  while step t trains, and the weights are handed over between steps, so

      step(s) = max(sample(s), train(chips − s)) + handover,

  each term as `estimate` models it on its own chips. Returns the split with the shortest
  step (splits whose sampler cannot hold the weights are skipped), its seconds, and the
  speed-up over the synchronous step on all `chips`. The learner's memory (optimizer state,
  activations) is not modelled, as in `estimate`."""
  if chips < 2:
    raise ValueError(f"chips: an asynchronous step needs >= 2 (a sampler's and a learner's), "
                     f"got {chips}")
  best = None
  for s in range(1, chips):
    try:
      sample = estimate(w, chip, s)["seconds"]
    except ValueError:  # the weights do not fit the sampler's chips
      continue
    train = estimate(w, chip, chips - s)["seconds"]["train"]
    step = max(sample["sample"], train) + sample["handover"]
    if best is None or step < best["seconds"]["step"]:
      best = {"sampler_chips": s, "trainer_chips": chips - s,
              "seconds": {"sample": sample["sample"], "train": train,
                          "handover": sample["handover"], "step": step}}
  if best is None:
    raise ValueError(f"{w.model}: no split of {chips} chips holds the weights on the sampler's")
  best["speedup"] = estimate(w, chip, chips)["seconds"]["step"] / best["seconds"]["step"]
  return best


def table(rows: list[dict]) -> str:
  """The rows of `estimate`, each with its `async` entry (`async_estimate`) where it has one."""
  head = ("| model | chips | rows × context | sampled / trained tokens | train PFLOP | sampler "
          "tok/s (model) | needed for ½ step | hand-over GB | sample / train / hand-over / "
          "step (s) | k ≥ 1: sampler + learner chips, step (s), × |")
  lines = [head, "|" + " --- |" * 10]
  for r in rows:
    s, a = r["seconds"], r.get("async")
    overlapped = (f"{a['sampler_chips']} + {a['trainer_chips']}, {a['seconds']['step']:.0f}, "
                  f"{a['speedup']:.2f}×" if a else "—")
    lines.append(
        f"| {r['model']} | {r['chips']} × {r['chip']} | {r['rows']} × {r['context']} | "
        f"{r['tokens_sampled'] / 1e6:.1f}M / {r['tokens_trained'] / 1e6:.1f}M | "
        f"{r['train_flops'] / 1e15:.0f} | {r['sampler_tokens_per_s']:,.0f} | "
        f"{r['sampler_tokens_per_s_needed_for_half_the_step']:,.0f} | "
        f"{r['handover_bytes'] / 1e9:.1f} | {s['sample']:.0f} / {s['train']:.0f} / "
        f"{s['handover']:.1f} / {s['step']:.0f} | {overlapped} |")
  return "\n".join(lines)
