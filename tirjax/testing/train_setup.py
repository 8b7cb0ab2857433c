"""What the train-step tests share: a tiny decoder, random policy / SFT batches with ragged
rows, meshes, and an optimizer that records the gradients it receives.

Batches have one fixed shape per test file (B rows of L tokens), so each step compiles once
per option set.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from tirjax import sharding, train_steps
from tirjax.models import config, decoder
from tirjax.testing.records import GroupRecord, RowRecord, StepRecord, build_rollouts

VOCAB = 64
CONFIG = config.tiny(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_heads=4,
                     num_kv_heads=2, head_dim=8)
# Clipping active at these scales; eps large enough that Adam's first, sign-like update is a
# smooth function of the gradient (float32 summation-order noise stays ~1e-8 in the params).
OPTIMIZER = train_steps.OptimizerOptions(learning_rate=1e-3, eps=1e-4, weight_decay=0.01,
                                      max_grad_norm=0.05, warmup_steps=2)


def mesh(shape, rules=sharding.DEFAULT_RULES):
  """A (data, fsdp, tensor) mesh over the first prod(shape) devices."""
  axes = tuple(zip(("data", "fsdp", "tensor"), shape))
  opts = sharding.ShardingOptions(mesh=axes, rules=rules)
  return sharding.make_mesh(opts, devices=jax.devices()[:int(np.prod(shape))])


class Recorded(NamedTuple):
  grads: optax.Params


def record_grads() -> optax.GradientTransformation:
  """Passes gradients through and keeps the last ones in its state (a params-shaped tree, so
  it is sharded like the parameters)."""
  return optax.GradientTransformation(
      init=lambda params: Recorded(jax.tree.map(jnp.zeros_like, params)),
      update=lambda grads, state, params=None: (grads, Recorded(grads)))


def optimizer(opts=OPTIMIZER) -> optax.GradientTransformation:
  """`make_optimizer(opts)` behind `record_grads`: `opt_state[0].grads` is the gradient the
  optimizer received (after accumulation, before clipping)."""
  return optax.chain(record_grads(), train_steps.make_optimizer(opts))


def setup(shape=(1, 1, 1), seed=0, tx=None, cfg=CONFIG):
  """(graphdef, params, tx, placement, state) of a freshly initialised tiny model."""
  m = mesh(shape)
  model = decoder.init(cfg, seed)
  graphdef, params = train_steps.split_model(model)
  tx = optimizer() if tx is None else tx
  place = train_steps.placement(params, tx, m)
  state = train_steps.init_state(params, tx, place, jax.random.key(seed))
  return graphdef, params, tx, place, state


def ragged_rows(rng, rows, length, min_len=3):
  """Right-padded token rows of random lengths (padding ids random too, -1 included)."""
  lengths = rng.integers(min_len, length + 1, rows)
  valid = np.arange(length)[None] < lengths[:, None]
  tokens = rng.integers(0, VOCAB, (rows, length)).astype(np.int32)
  tokens = np.where(valid, tokens, rng.integers(-1, VOCAB, (rows, length))).astype(np.int32)
  return tokens, valid, lengths


def policy_batch(rng, rows=16, length=12, with_ref=False) -> train_steps.PolicyBatch:
  """Prompts of 1-4 tokens, then generated tokens; one padding row (row_mask False), one row
  whose tokens are all prompt (no loss tokens); old log-probs near -log V so that ratios fall
  on both sides of the clip range."""
  tokens, valid, lengths = ragged_rows(rng, rows, length)
  prompt = rng.integers(1, 5, rows)
  pos = np.arange(length)[None]
  loss_mask = valid & (pos >= prompt[:, None])
  loss_mask[1] = False
  row_mask = np.ones(rows, bool)
  row_mask[0] = False
  old = np.where(valid, -np.log(VOCAB) + rng.normal(0, 0.4, (rows, length)), 0.0)
  adv = np.where(loss_mask, rng.normal(0, 1, (rows, length)), 0.0)
  ref = (np.where(valid, -np.log(VOCAB) + rng.normal(0, 0.2, (rows, length)), 0.0)
         if with_ref else None)
  f32 = lambda x: None if x is None else np.asarray(x, np.float32)
  return train_steps.PolicyBatch(tokens=tokens, token_valid=valid, loss_mask=loss_mask,
                              old_logprobs=f32(old), advantages=f32(adv), row_mask=row_mask,
                              ref_logprobs=f32(ref))


def sft_batch(rng, rows=8, length=12) -> train_steps.SFTBatch:
  """Prompt (masked), answer (targets), and 0-2 masked trailing tokens per row."""
  tokens, valid, lengths = ragged_rows(rng, rows, length, min_len=6)
  pos = np.arange(length)[None]
  prompt = rng.integers(1, 3, rows)[:, None]
  trailing = rng.integers(0, 3, rows)[:, None]
  loss_mask = valid & (pos >= prompt) & (pos < lengths[:, None] - trailing)
  return train_steps.SFTBatch(tokens=tokens, token_valid=valid, loss_mask=loss_mask)


def demonstrations(rng, rows=12, length=24, prefix=9) -> train_steps.SFTBatch:
  """An `sft_batch` whose rows share as demonstrations do: all start with one `prefix`-token
  system prompt, pairs of rows share a longer prefix (a first turn in common), one row is a
  duplicate of another and one carries no target; targets after a 1-3-token user turn past
  each row's shared part, 0-2 masked trailing tokens."""
  tokens, valid, lengths = ragged_rows(rng, rows, length, min_len=prefix + 4)
  tokens[:, :prefix] = rng.integers(0, VOCAB, prefix)
  for r in range(0, rows - 1, 4):  # rows r, r + 1 share a first turn
    shared = prefix + int(rng.integers(1, 4))
    tokens[r + 1, :shared] = tokens[r, :shared]
    valid[r + 1, :shared] = True
  tokens[rows - 1], valid[rows - 1] = tokens[rows - 2], valid[rows - 2]  # a duplicate
  lengths = valid.sum(axis=1)
  pos = np.arange(length)[None]
  start = prefix + rng.integers(1, 4, rows)[:, None]
  trailing = rng.integers(0, 3, rows)[:, None]
  loss_mask = valid & (pos >= start) & (pos < lengths[:, None] - trailing)
  loss_mask[2] = False
  return train_steps.SFTBatch(tokens=tokens, token_valid=valid, loss_mask=loss_mask)


def tiny_rollouts(seed=0, groups=4, length=16):
  """`groups` query groups of a right and a wrong row, each a prompt, a call with its response
  and an answer of 1-3 tokens (random tokens of `VOCAB`): rollouts to push through a trainer's
  loss inputs."""
  rng = np.random.default_rng(seed)
  tok = lambda n: tuple(int(t) for t in rng.integers(0, VOCAB, n))
  return build_rollouts([GroupRecord(rows=[RowRecord(outcome=o, prompt_tokens=tok(2), steps=[
      StepRecord(tokens=tok(3), logprobs=(0.0,) * 3, response_tokens=tok(2)),
      StepRecord(tokens=tok(int(rng.integers(1, 4))))]) for o in (1, -1)])
      for _ in range(groups)], max_tokens=length)
