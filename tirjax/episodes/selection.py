"""Which sampled continuations survive: the pure selection rules of the tree and ARPO modes.

No sampler, no environment: counts, entropies and a `numpy.random.Generator` in, decisions out,
so the rules are tested on their own.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from tirjax.episodes.options import ArpoOptions


def tree_select(num_candidates: int, num_keep: int, rng: np.random.Generator) -> np.ndarray:
  """PORTool's Algorithm 1, one depth: `num_keep = n − n_c` of all candidates, uniformly at
  random without replacement (spec §4.1). Returns the chosen candidate indices, sorted.

  Candidates are numbered node-major (candidate j of active node i is `i·f + j`).
  """
  if not 0 <= num_keep <= num_candidates:
    raise ValueError(f"num_keep: must lie in [0, num_candidates={num_candidates}], "
                     f"got {num_keep}")
  return np.sort(rng.choice(num_candidates, size=num_keep, replace=False))


def position_entropy(entropy: Optional[float], top_logprobs: Optional[dict]) -> float:
  """The entropy of one position: the sampler's full-vocabulary value when given, else
  ARPO's top-k estimate −Σ_{v ∈ top-k} p_v log p_v (not renormalised, as in dongguanting/ARPO
  `vllm_rollout_with_tools.py::_calc_entropy`)."""
  if entropy is not None:
    return float(entropy)
  if top_logprobs is None:
    raise ValueError("position_entropy: need the sampler's entropy or its top log-probs")
  return -sum(math.exp(lp) * lp for lp in top_logprobs.values() if math.isfinite(lp))


def step_entropy(entropies: Optional[Sequence[float]],
                 top_logprobs: Optional[Sequence[dict]], num_tokens: int, num_positions: int,
                 vocab_size: int) -> float:
  """ARPO's entropy score of a step: `H = Σ_{j < k} H_j / log|V|` over its first k generated
  positions (Dong et al. 2025, §3.2, "entropy of the first k tokens"; the sum and the
  normalisation by log|V| are those of the public code). Uses `Sample.entropies` when the
  sampler gives them, else `Sample.top_logprobs`."""
  if vocab_size < 2:
    raise ValueError(f"vocab_size: must be >= 2, got {vocab_size}")
  k = min(num_positions, num_tokens)
  if entropies is not None:
    total = sum(position_entropy(entropies[j], None) for j in range(k))
  elif top_logprobs is not None:
    total = sum(position_entropy(None, top_logprobs[j]) for j in range(k))
  else:
    raise ValueError("step_entropy: the sampler gave neither entropies nor top log-probs; "
                     "ARPO needs one of them")
  return total / math.log(vocab_size)


def branch_count(delta: float, attempts: int, options: ArpoOptions,
                 rng: np.random.Generator) -> int:
  """Copies a row gets in `attempts` tries of ARPO's rule: a try succeeds iff
  `clip(u − w·ΔH, 0, 1) ≤ τ`, u ~ U(0, 1) (so P = clip(τ + w·ΔH, 0, 1); ΔH = H_now − H_init).

  Dong et al. 2025, Eq. 2-3 (P_t = α + β·ΔH_t, branch when above τ), as implemented in
  dongguanting/ARPO `verl_arpo_entropy/.../vllm_rollout_with_tools.py`.
  """
  made = 0
  for _ in range(attempts):
    p = min(max(rng.random() - options.entropy_weight * delta, 0.0), 1.0)
    made += p <= options.branch_probability
  return made


def arpo_branches(deltas: Sequence[float], slots: int, options: ArpoOptions,
                  rng: np.random.Generator) -> list[int]:
  """Copies for each active row of one query, in order: each tries up to `beam_size − 1`
  copies while the query's remaining budget `slots` (N − rows so far) lasts."""
  copies, made = [], 0
  for delta in deltas:
    attempts = min(options.beam_size - 1, slots - made)
    c = branch_count(delta, attempts, options, rng) if attempts > 0 else 0
    copies.append(c)
    made += c
  return copies
