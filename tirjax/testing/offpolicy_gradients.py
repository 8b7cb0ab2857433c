"""Policy gradients from a mismatched sampler, against the on-policy gradient, on a tiny model
whose every continuation can be listed (the rollout-correction test and study).

A tiny decoder over a vocabulary of V tokens continues one fixed prompt by K tokens, so the
V^K continuations y can all be enumerated and every expectation is a finite sum. The trainer's
policy π (= π_old at the first update) is the model at temperature 1. The sampler is
perturbed: the same model sampled at another temperature τ ("temperature"), or with its
parameters rounded to bfloat16 ("bf16"); it reports its own log-probs, as vLLM and the JAX
sampler do. A fixed reward R(y) gives the advantage A(y) = R(y) − E_π[R].

Gradients are taken of the trainer's policy loss (`tirjax.loss.policy_loss`, the clipped
surrogate at ρ = 1, `seq_mean_token_sum`), whose gradient for a batch of rows y_i is
−(1/N) Σ_i w_i A(y_i) ∇ log π(y_i) (w = 1 uncorrected):

  on-policy   g*      = −E_{y~π}[A(y) ∇ log π(y)]                 exact (enumeration)
  expected    E[ĝ]    = −Σ_y π_s(y) w(y) A(y) ∇ log π(y)         exact: each continuation a
              row, its advantage A(y)·π_s(y)·N (the loss is linear in a row's positive
              advantage scale, so this weighs row y by π_s(y) and nothing else)
  sampled     ĝ       the loss on N continuations drawn from π_s

Sequence-level IS without truncation makes E[ĝ] = g* (exactly, up to float rounding);
uncorrected, E[ĝ] = −E_{π_s}[A ∇ log π] ≠ g*; token-level TIS and truncation sit between.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tirjax import loss
from tirjax.loss import rollout_correction
from tirjax.loss.rollout_correction import RolloutCorrectionOptions
from tirjax.models import config as model_config
from tirjax.models import decoder
from tirjax.models.logprobs import token_logprobs

PROMPT = (1, 2)


@dataclasses.dataclass(frozen=True)
class Setup:
  """The tiny policy and what the sampler changes.

  Attributes:
    vocab, new_tokens: V and K (V^K continuations).
    init_std: the decoder's init scale (0.02 gives near-uniform next tokens; larger, peaked).
    perturbation: "temperature" (the sampler's policy is softmax(z / τ)) or "bf16" (its
      parameters rounded to bfloat16), or "none" (the sampler is the trainer).
    temperature: τ of "temperature".
    seed: the model's initialisation.
  """

  vocab: int = 8
  new_tokens: int = 3
  init_std: float = 0.5
  perturbation: str = "temperature"
  temperature: float = 1.5
  seed: int = 0


def model(setup: Setup) -> decoder.Decoder:
  cfg = model_config.tiny(vocab_size=setup.vocab, hidden_size=32, intermediate_size=64,
                          num_heads=4, num_kv_heads=2, head_dim=8, init_std=setup.init_std)
  return decoder.init(cfg, setup.seed)


def continuations(setup: Setup) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(tokens [N, P+K] of every continuation of the prompt, token_valid, loss_mask)."""
  ys = np.array(list(itertools.product(range(setup.vocab), repeat=setup.new_tokens)), np.int32)
  prompt = np.broadcast_to(np.asarray(PROMPT, np.int32), (len(ys), len(PROMPT)))
  tokens = np.concatenate([prompt, ys], axis=1)
  valid = np.ones(tokens.shape, bool)
  loss_mask = np.zeros(tokens.shape, bool)
  loss_mask[:, len(PROMPT):] = True
  return tokens, valid, loss_mask


def reward(tokens: np.ndarray, setup: Setup) -> np.ndarray:
  """R(y): how many of y's tokens lie in the vocabulary's lower half, plus 1 when y ends
  with the token it starts with (a reward that depends on the whole sequence)."""
  y = tokens[:, len(PROMPT):]
  return ((y < setup.vocab // 2).sum(axis=1) + (y[:, 0] == y[:, -1])).astype(np.float32)


@functools.partial(jax.jit, static_argnums=(1, 4))
def _logprobs(params, graphdef, tokens, valid, temperature=1.0):
  return token_logprobs(nnx.merge(graphdef, params), tokens, valid, chunk_size=64,
                        temperature=temperature)[0]


def sampler_logprobs(setup: Setup, graphdef, params, tokens, valid) -> jax.Array:
  """The perturbed sampler's log-probs of `tokens` [N, P+K]."""
  if setup.perturbation == "temperature":
    return _logprobs(params, graphdef, tokens, valid, setup.temperature)
  if setup.perturbation == "bf16":
    rounded = jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(x.dtype), params)
    return _logprobs(rounded, graphdef, tokens, valid)
  if setup.perturbation == "none":
    return _logprobs(params, graphdef, tokens, valid)
  raise ValueError(f"perturbation: {setup.perturbation!r}")


@functools.partial(jax.jit, static_argnums=(1, 8))
def _gradient(params, graphdef, tokens, valid, mask, adv, old, sampler, opts):
  def objective(p):
    logp = _logprobs(p, graphdef, tokens, valid)
    out = loss.policy_loss(logp, old, adv, mask, jnp.ones(mask.shape[:1], bool), opts,
                           sampler_logprobs=sampler if opts.rollout_correction.enabled else None)
    return out.loss.value

  return jax.grad(objective)(params)


def flat(tree) -> np.ndarray:
  return np.concatenate([np.asarray(x, np.float64).reshape(-1) for x in jax.tree.leaves(tree)])


def compare(g: np.ndarray, target: np.ndarray) -> dict:
  """Cosine similarity (None for a zero gradient: MIS masked every row) and relative error
  ‖g − g*‖ / ‖g*‖."""
  norm = np.linalg.norm(g)
  return {"cosine": float(g @ target / (norm * np.linalg.norm(target))) if norm > 0 else None,
          "relative_error": float(np.linalg.norm(g - target) / np.linalg.norm(target))}


class Problem:
  """One `Setup`'s model, continuations, probabilities and advantages."""

  def __init__(self, setup: Setup):
    self.setup = setup
    self.graphdef, self.params = nnx.split(model(setup), nnx.Param)
    self.tokens, self.valid, self.loss_mask = continuations(setup)
    self.old = _logprobs(self.params, self.graphdef, self.tokens, self.valid)
    self.sampler = sampler_logprobs(setup, self.graphdef, self.params, self.tokens, self.valid)
    seq = lambda lp: np.asarray(jnp.sum(jnp.where(self.loss_mask, lp, 0.0), axis=1), np.float64)
    self.p_trainer = np.exp(seq(self.old))
    self.p_sampler = np.exp(seq(self.sampler))
    # the enumeration is complete: both sum to 1 (up to float32 rounding)
    self.p_trainer /= self.p_trainer.sum()
    self.p_sampler /= self.p_sampler.sum()
    r = reward(self.tokens, setup)
    self.advantage = (r - float(self.p_trainer @ r)).astype(np.float32)

  def loss_gradient(self, rows: np.ndarray, advantages: np.ndarray,
                    correction: Optional[RolloutCorrectionOptions]) -> np.ndarray:
    """∇θ of the trainer's loss on continuations `rows` with row advantages `advantages`."""
    opts = loss.LossOptions(aggregation="seq_mean_token_sum",
                            rollout_correction=correction or RolloutCorrectionOptions())
    mask = self.loss_mask[rows]
    adv = np.where(mask, advantages[:, None], 0.0).astype(np.float32)
    return flat(_gradient(self.params, self.graphdef, self.tokens[rows], self.valid[rows], mask,
                          adv, self.old[rows], self.sampler[rows], opts))

  def on_policy(self) -> np.ndarray:
    """g* = −E_π[A ∇ log π], exact: every continuation weighted by π(y) (trainer = sampler)."""
    rows = np.arange(len(self.tokens))
    return self.loss_gradient(rows, self.advantage * self.p_trainer * len(rows), None)

  def kept(self, correction: Optional[RolloutCorrectionOptions]) -> np.ndarray:
    """[N] bool, the continuations that the correction's MIS keeps (all without MIS)."""
    if correction is None or correction.mask_level == "off":
      return np.ones(len(self.tokens), bool)
    return np.asarray(rollout_correction.correction(self.old, self.sampler, self.loss_mask,
                                                    correction).keep)

  def expected(self, correction: Optional[RolloutCorrectionOptions]) -> np.ndarray:
    """E_{y~π_s}[ĝ(y)], exact: every continuation weighted by the sampler's π_s(y). With MIS,
    its many-sample limit: the loss averages over the kept rows, so the sum over kept
    continuations is divided by P_s(kept) (the loss on the enumeration divides by their
    count, which is undone); 0 when MIS keeps none."""
    rows = np.arange(len(self.tokens))
    g = self.loss_gradient(rows, self.advantage * self.p_sampler * len(rows), correction)
    kept = self.kept(correction)
    mass = self.p_sampler[kept].sum()
    return g * kept.sum() / (len(rows) * mass) if mass > 0 else np.zeros_like(g)

  def sampled(self, correction: Optional[RolloutCorrectionOptions], num: int,
              seed: int) -> np.ndarray:
    """ĝ on `num` continuations drawn from π_s."""
    rows = np.random.default_rng(seed).choice(len(self.tokens), size=num, p=self.p_sampler)
    return self.loss_gradient(rows, self.advantage[rows], correction)

  def gap(self) -> dict:
    """The per-token |log π_old − log π_sampler| over the continuations' tokens, weighted by
    how often the sampler draws them, and KL(π_s ‖ π) over whole continuations."""
    d = np.abs(np.asarray(self.old - self.sampler, np.float64))[self.loss_mask]
    w = np.repeat(self.p_sampler, self.setup.new_tokens)
    log_ratio = np.log(self.p_sampler) - np.log(self.p_trainer)
    return {"token_gap_mean": float(w @ d / w.sum()), "token_gap_max": float(d.max()),
            "sequence_kl_sampler_trainer": float(self.p_sampler @ log_ratio)}
