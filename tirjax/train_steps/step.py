"""Jitted train steps: gradient accumulation over micro-batches, clipping, AdamW, metrics.

    sh = dataclass_from_config(sharding.ShardingOptions, config.sharding)   # mesh + rules
    mesh = sharding.make_mesh(sh)
    model = decoder.init(model_cfg, rules=sh.rules)
    graphdef, params = split_model(model)
    tx = make_optimizer(OptimizerOptions(...))
    place = placement(params, tx, mesh, sh.rules)
    state = init_state(params, tx, place, jax.random.key(0))        # a checkpoint.TrainState
    step = policy_step(graphdef, tx, place, LossOptions(...), StepOptions(num_microbatches=4))
    state, metrics = step(state, sharding.shard_batch(policy_batch(rollouts, adv), mesh, sh.rules))

One step, for any loss that is a `Mean(sum, den)` (spec §5: the policy loss; the SFT loss):

    g = Σ_m ∇ sum_m / max(Σ_m den_m, 1),      m over micro-batches of rows

so the update equals the full-batch one under every aggregation mode (each mode's
denominator is parameter-free and additive over rows), and an all-masked batch has g = 0.
Then `params ← AdamW(clip(g))`. Micro-batches run sequentially in a `lax.scan`, so peak
activation memory is one micro-batch's; the gradient sum is float32 and sharded like the
parameters.

The jitted function has declared in/out shardings (parameters and optimizer state by the
logical rules, the batch's rows over the batch axes, metrics replicated) and donates the
parameters and optimizer state: after a step, arrays of the previous state (and any model
merged from them) are invalid.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tirjax import distributed, option_checks, sharding
from tirjax.checkpoint import TrainState
from tirjax.loss import objective
from tirjax.loss.stats import Mean, Summary, finalize
from tirjax.models.logprobs import token_logprobs
from tirjax.train_steps import optimizer as optimizer_lib
from tirjax.train_steps import sft as sft_lib
from tirjax.train_steps.batches import PolicyBatch, SFTBatch, split_microbatches
from tirjax.train_steps.minibatches import gather_rows

# loss_fn(model, micro_batch) -> (objective, stats, counts): the objective's `sum` is
# differentiated; `stats` (a pytree of `Mean` / `Summary`) are merged across micro-batches and
# finalised; `counts` (a dict of arrays) are summed.
LossFn = Callable[[nnx.Module, Any], tuple[Mean, Any, dict]]


@dataclasses.dataclass(frozen=True)
class StepOptions:
  """How a step computes: micro-batching, log-prob chunking, temperature, entropy.

  Attributes:
    num_microbatches: sequential micro-batches per step; must divide the batch's rows (for
      balanced devices, rows / num_microbatches should be a multiple of the batch shards).
      Packed: at least this many (the token budget may need more).
    packed: the policy step and its log-prob passes (reference, π_old) forward each query
      group once as a packed forest: every shared prefix (a group's prompt, a tree's shared
      steps) computed once, no padding (`tirjax.train_steps.packed`); micro-batches by
      `max_tokens_per_microbatch`. False: every `[B, L]` row whole (the padded path). The
      SFT step follows it (`sft.step` is derived from `step`): each batch's
      demonstrations packed as forests, their shared system prompt computed once
      (`tirjax.train_steps.packed_sft`).
    max_tokens_per_microbatch: packed tokens per batch shard per micro-batch (a query group
      is never split: a longer one is a micro-batch of its own).
    attention_block: packed attention's query block (each block reads its first token's
      ancestors and itself: cost ∝ tokens × (longest row + block)).
    bucket_steps: packed sizes per octave of the sequence length and the log-probs computed
      (`packing.bucket`): more sizes, less padding computed (4: ≤ 25%; 2: ≤ 50%). A run's
      shapes only grow (`packed.Packer.ratchet`), so finer sizes add few compilations.
    logprob_chunk_size: positions whose `[chunk, vocab]` logits are materialised at a time.
    temperature: log-probs are taken of softmax(logits / temperature). Keep 1 (the default):
      both samplers report `old_logprobs` under the raw model (temperature 1, no top-p), so
      any other value skews the ratio π/π_old even for the sampler's own weights.
    log_entropy: compute the policy entropy for the metrics even when the entropy
      coefficient is 0 (it costs a second pass over each logits chunk).
  """

  num_microbatches: int = 1
  packed: bool = False
  max_tokens_per_microbatch: int = 16384
  attention_block: int = 64
  bucket_steps: int = 4
  logprob_chunk_size: int = 1024
  temperature: float = 1.0
  log_entropy: bool = False

  def __post_init__(self):
    option_checks.int_at_least("num_microbatches", self.num_microbatches, 1)
    option_checks.flag("packed", self.packed)
    option_checks.int_at_least("max_tokens_per_microbatch", self.max_tokens_per_microbatch, 1)
    option_checks.int_at_least("attention_block", self.attention_block, 1)
    option_checks.int_at_least("bucket_steps", self.bucket_steps, 1)
    option_checks.int_at_least("logprob_chunk_size", self.logprob_chunk_size, 1)
    option_checks.finite_above("temperature", self.temperature, 0)


@dataclasses.dataclass(frozen=True)
class Placement:
  """Where a train step's arrays live: the mesh, the logical rules, and the shardings of the
  parameters (an `nnx.State` of `NamedSharding`s) and of the optimizer state."""

  mesh: Mesh
  rules: sharding.Rules
  params: Any
  opt_state: Any

  @property
  def batch(self) -> NamedSharding:
    """Rows over the batch mesh axes, every other axis replicated."""
    return NamedSharding(self.mesh, sharding.batch_spec(self.rules))

  @property
  def replicated(self) -> NamedSharding:
    return NamedSharding(self.mesh, PartitionSpec())


def split_model(model: nnx.Module) -> tuple[nnx.GraphDef, nnx.State]:
  """(graphdef, parameters); fails if the model holds state other than `nnx.Param`."""
  return nnx.split(model, nnx.Param)


def placement(params: nnx.State, tx: optax.GradientTransformation, mesh: Mesh,
              rules: sharding.Rules = sharding.DEFAULT_RULES) -> Placement:
  """Shardings of `params` (concrete or abstract) by their logical names, and of `tx`'s state."""
  param_shardings = sharding.state_shardings(params, mesh, rules)
  opt_shardings = sharding.opt_state_shardings(tx, jax.eval_shape(tx.init, params),
                                               param_shardings)
  return Placement(mesh=mesh, rules=rules, params=param_shardings, opt_state=opt_shardings)


def placed_copy(tree: Any, shardings: Any) -> Any:
  """New buffers holding `tree`, placed by `shardings`.

  A jitted copy, not `jax.device_put(..., may_alias=False)`: in jax 0.10 that still shares
  the source buffer with the shard of a replicated array on the source's device, so donating
  the copy would delete the source.
  """
  if distributed.is_multiprocess() and all(
      x.is_fully_addressable for x in jax.tree.leaves(tree) if isinstance(x, jax.Array)):
    # This process's own arrays (a model built or loaded here) cannot enter a computation over
    # every process's devices: each process places its host copy (the same on all of them).
    return jax.device_put(jax.device_get(tree), shardings)
  return jax.jit(lambda t: jax.tree.map(jnp.copy, t), out_shardings=shardings)(tree)


def init_state(params: nnx.State, tx: optax.GradientTransformation, place: Placement,
               rng: jax.Array, *, step: int = 0, data_position: Optional[dict] = None,
               policy_version: int = 0) -> TrainState:
  """A checkpointable `TrainState` with copies of `params` placed by `place` and a fresh
  optimizer state. Copies, because train steps donate the state's arrays."""
  params = placed_copy(params, place.params)
  opt_state = jax.jit(tx.init, out_shardings=place.opt_state)(params)
  return TrainState(step=step, params=params, opt_state=opt_state, rng=rng,
                    data_position=dict(data_position or {}), policy_version=policy_version)


def _is_stat(x) -> bool:
  return isinstance(x, (Mean, Summary))


def _merge(a: Any, b: Any) -> Any:
  return jax.tree.map(lambda x, y: x.merge(y) if _is_stat(x) else x + y, a, b, is_leaf=_is_stat)


def accumulate_gradients(loss_fn: Callable[[Any, Any], tuple[Mean, Any, dict]], params: Any,
                         microbatches: Any, grad_shardings: Any = None
                         ) -> tuple[Any, tuple[Mean, Any, dict]]:
  """`(Σ_m ∇ objective_m.sum) / max(Σ_m objective_m.den, 1)` and the merged outputs.

  Args:
    loss_fn: `(params, micro_batch) -> (objective, stats, counts)` (see `LossFn`).
    params: the parameters (closed over, not carried).
    microbatches: a pytree with leading axis [num_microbatches, ...], scanned over.
    grad_shardings: shardings of the float32 gradient sum (e.g. the parameters').

  Returns:
    The float32 gradient of the batch objective `Σ sum / max(Σ den, 1)`, and the objective,
    stats and counts merged over micro-batches.
  """
  first = jax.tree.map(lambda x: x[0], microbatches)
  aux_shapes = jax.eval_shape(loss_fn, params, first)
  zeros = (jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params),
           jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), aux_shapes))

  def body(carry, mb):
    def summed(p):
      out = loss_fn(p, mb)
      return out[0].sum, out

    grad_sum, aux_sum = carry
    grads, aux = jax.grad(summed, has_aux=True)(params)
    grad_sum = jax.tree.map(lambda s, g: s + g.astype(jnp.float32), grad_sum, grads)
    if grad_shardings is not None:
      grad_sum = jax.lax.with_sharding_constraint(grad_sum, grad_shardings)
    return (grad_sum, _merge(aux_sum, aux)), None

  (grad_sum, aux), _ = jax.lax.scan(body, zeros, microbatches)
  den = jnp.maximum(aux[0].den, 1.0)
  return jax.tree.map(lambda g: g / den, grad_sum), aux


class TrainStep:
  """`(TrainState, batch) -> (TrainState, metrics)`: one optimizer update per call.

  `jitted` is the compiled function `(params, opt_state, batch) -> (params, opt_state,
  metrics)`; it traces once per batch shape.
  Metrics: the finalised loss statistics, `grad_norm` (global norm before clipping),
  `learning_rate` (of this update), `tokens/loss` (tokens in the loss), `tokens/valid` (real
  tokens of the batch's rows), `tokens/forwarded` (positions the model ran, padding included).
  `num_microbatches` None: the batch says how many (`batch.num_microbatches`).
  `packer`: the packed steps' `packed.Packer` (its sizes are resumable state); None here.
  """

  packer = None

  def __init__(self, graphdef: nnx.GraphDef, tx: optax.GradientTransformation,
               loss_fn: LossFn, place: Placement, num_microbatches: Optional[int]):
    self.placement = place

    def model_loss(params, mb):
      return loss_fn(nnx.merge(graphdef, params), mb)

    def step(params, opt_state, batch):
      mbs = split_microbatches(batch, num_microbatches or batch.num_microbatches)
      mbs = jax.tree.map(
          lambda x: sharding.constrain(x, (None, "batch") + (None,) * (x.ndim - 2), place.rules),
          mbs)
      grads, (_, stats, counts) = accumulate_gradients(model_loss, params, mbs, place.params)
      grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
      updates, opt_state = tx.update(grads, opt_state, params)
      params = optax.apply_updates(params, updates)
      metrics = {**finalize(stats), **counts, "grad_norm": optax.global_norm(grads)}
      lr = optimizer_lib.learning_rate(opt_state)
      if lr is not None:
        metrics["learning_rate"] = lr
      return params, opt_state, metrics

    self.jitted = jax.jit(step, in_shardings=(place.params, place.opt_state, place.batch),
                          out_shardings=(place.params, place.opt_state, place.replicated),
                          donate_argnums=(0, 1))

  def prepare(self, batch: Any, group_id: np.ndarray) -> Callable[[Optional[np.ndarray]], Any]:
    """`rows -> this step's input`: rows `rows` of `batch` gathered on the devices
    (`minibatches.gather_rows`; the batch is placed once), or with `rows` None the batch as
    it is. `group_id`: [B], every row's query group (whole on every process)."""
    del group_id  # rows are gathered as they are
    placed = []

    def select(rows: Optional[np.ndarray]) -> Any:
      if rows is None:
        return batch
      if not placed:
        placed.append(jax.device_put(batch, self.placement.batch))
      return gather_rows(placed[0], rows, self.placement.batch)

    return select

  def __call__(self, state: TrainState, batch: Any) -> tuple[TrainState, dict[str, jax.Array]]:
    """One update. `batch`: host arrays (one process) or arrays from `sharding.shard_batch`;
    both are placed the same way first, so they share one compilation."""
    batch = jax.device_put(batch, self.placement.batch)
    with jax.set_mesh(self.placement.mesh):
      params, opt_state, metrics = self.jitted(state.params, state.opt_state, batch)
    return dataclasses.replace(state, step=state.step + 1, params=params,
                               opt_state=opt_state), metrics


def policy_loss_fn(loss_opts: objective.LossOptions, opts: StepOptions) -> LossFn:
  """The policy loss (spec §5) of a `PolicyBatch` under the model's chunked log-probs;
  the entropy is computed only when its coefficient is > 0 or `opts.log_entropy`."""
  with_entropy = loss_opts.entropy_coef > 0 or opts.log_entropy

  def loss_fn(model, mb: PolicyBatch):
    logp, entropy = token_logprobs(model, mb.tokens, mb.token_valid,
                                   chunk_size=opts.logprob_chunk_size,
                                   temperature=opts.temperature, with_entropy=with_entropy)
    out, counts = policy_terms(logp, entropy, mb, loss_opts)
    counts["tokens/valid"] = jnp.sum(mb.token_valid, dtype=jnp.float32)
    counts["tokens/forwarded"] = jnp.float32(mb.tokens.size)
    return out.loss, out, counts

  return loss_fn


def policy_terms(logp: jax.Array, entropy: Optional[jax.Array], rows: Any,
                 loss_opts: objective.LossOptions) -> tuple[objective.LossOutput, dict]:
  """`policy_loss` of per-row log-probs (and entropies) `[B, L]`, its other inputs read from
  `rows` (a `PolicyBatch`'s fields, `[B, L]` / `[B]`), and the count `tokens/loss`."""
  out = objective.policy_loss(logp, rows.old_logprobs, rows.advantages, rows.loss_mask,
                               rows.row_mask, loss_opts, ref_logprobs=rows.ref_logprobs,
                               entropy=entropy, sampler_logprobs=rows.sampler_logprobs)
  # the loss's own mask: rows that a rollout correction's MIS drops are not counted
  return out, {"tokens/loss": out.metrics["ratio"].count}


def sft_loss_fn(sft_opts: sft_lib.SFTLossOptions, opts: StepOptions) -> LossFn:
  """Masked next-token cross-entropy of an `SFTBatch` (temperature 1: the data's
  likelihood, whatever the sampling temperature)."""

  def loss_fn(model, mb: SFTBatch):
    logp, _ = token_logprobs(model, mb.tokens, mb.token_valid,
                             chunk_size=opts.logprob_chunk_size)
    mask = sft_lib.target_mask(mb.token_valid, mb.loss_mask)
    nll = sft_lib.sft_loss(logp, mask, sft_opts)
    counts = {"tokens/loss": jnp.sum(mask, dtype=jnp.float32),
              "tokens/valid": jnp.sum(mb.token_valid, dtype=jnp.float32),
              "tokens/forwarded": jnp.float32(mb.tokens.size)}
    return nll, {"loss": nll}, counts

  return loss_fn


def padded_sft_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation,
                    place: Placement, sft_opts: sft_lib.SFTLossOptions = sft_lib.SFTLossOptions(),
                    opts: StepOptions = StepOptions()) -> TrainStep:
  """The supervised warm-start step on `SFTBatch`es, every row forwarded whole (the packed one:
  `steps.sft_step`)."""
  return TrainStep(graphdef, tx, sft_loss_fn(sft_opts, opts), place, opts.num_microbatches)
