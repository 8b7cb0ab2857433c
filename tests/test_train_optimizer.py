"""The optimizer against float64 references (schedules, clipped AdamW), option errors, the
micro-batch split, and the FLOPs / MFU arithmetic."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tirjax.testing.reference import train_step as ref
from tirjax.models import config
from tirjax.train_steps import batches, flops
from tirjax.train_steps.optimizer import (OptimizerOptions, learning_rate, learning_rate_schedule,
                                       make_optimizer)


@given(schedule=st.sampled_from(["constant", "cosine"]), warmup=st.integers(0, 20),
       decay=st.integers(1, 50), fraction=st.sampled_from([0.0, 0.1, 1.0]),
       lr=st.floats(1e-7, 1.0))
def test_schedule_matches_reference(schedule, warmup, decay, fraction, lr):
  opts = OptimizerOptions(learning_rate=lr, schedule=schedule, warmup_steps=warmup,
                          decay_steps=decay, final_lr_fraction=fraction)
  n = np.arange(80)
  got = np.asarray(jax.vmap(learning_rate_schedule(opts))(jnp.asarray(n)))
  want = [ref.schedule(int(i), learning_rate=lr, schedule=schedule, warmup_steps=warmup,
                       decay_steps=decay, final_lr_fraction=fraction) for i in n]
  np.testing.assert_allclose(got, want, rtol=1e-5)
  assert got[0] > 0  # the first update moves the parameters
  assert np.isclose(got[warmup], lr, rtol=1e-6)


@pytest.mark.parametrize("opts", [
    OptimizerOptions(learning_rate=1e-2, warmup_steps=2, max_grad_norm=0.5),
    OptimizerOptions(learning_rate=3e-3, schedule="cosine", decay_steps=3, weight_decay=0.0,
                     max_grad_norm=None, b1=0.8, b2=0.95, eps=1e-6),
])
def test_adamw_matches_reference(opts):
  rng = np.random.default_rng(0)
  params = {"w": rng.normal(size=(3, 4)).astype(np.float32),
            "b": rng.normal(size=(4,)).astype(np.float32)}
  grads_seq = [{k: rng.normal(0, 0.5, v.shape).astype(np.float32) for k, v in params.items()}
               for _ in range(5)]
  tx = make_optimizer(opts)
  state = tx.init(params)
  p = params
  update = jax.jit(tx.update)
  lrs = []
  got = []
  for g in grads_seq:
    updates, state = update(g, state, p)
    p = jax.tree.map(lambda a, u: a + u, p, updates)
    got.append(p)
    lrs.append(float(learning_rate(state)))
  want_lrs = [ref.schedule(i, **{f: getattr(opts, f) for f in (
      "learning_rate", "schedule", "warmup_steps", "decay_steps", "final_lr_fraction")})
      for i in range(5)]
  np.testing.assert_allclose(lrs, want_lrs, rtol=1e-6)
  want = ref.adamw_steps([params["b"], params["w"]], [[g["b"], g["w"]] for g in grads_seq],
                         lrs=want_lrs, b1=opts.b1, b2=opts.b2, eps=opts.eps,
                         weight_decay=opts.weight_decay, max_grad_norm=opts.max_grad_norm)
  for got_p, want_p in zip(got, want):
    np.testing.assert_allclose(got_p["b"], want_p[0], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got_p["w"], want_p[1], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("change, match", [
    (dict(learning_rate=0.0), "learning_rate"),
    (dict(learning_rate=float("nan")), "learning_rate"),
    (dict(schedule="linear"), "schedule"),
    (dict(warmup_steps=-1), "warmup_steps"),
    (dict(warmup_steps=2.5), "warmup_steps"),
    (dict(schedule="cosine"), "decay_steps"),
    (dict(final_lr_fraction=1.5), "final_lr_fraction"),
    (dict(b1=1.0), "b1"),
    (dict(b2=-0.1), "b2"),
    (dict(eps=0.0), "eps"),
    (dict(weight_decay=-1e-3), "weight_decay"),
    (dict(max_grad_norm=0.0), "max_grad_norm"),
])
def test_invalid_options_name_the_option(change, match):
  with pytest.raises(ValueError, match=match):
    OptimizerOptions(**change)


def test_learning_rate_absent_without_injected_hyperparameters():
  assert learning_rate(optax.adam(1e-3).init({"w": jnp.zeros(2)})) is None


@given(rows=st.sampled_from([4, 8, 12]), num=st.sampled_from([1, 2, 4]))
def test_microbatch_split_is_strided_and_inverted_by_merge(rows, num):
  x = np.arange(rows * 3).reshape(rows, 3)
  tree = {"x": x, "r": np.arange(rows)}
  split = batches.split_microbatches(tree, num)
  assert split["x"].shape == (num, rows // num, 3)
  for m in range(num):
    np.testing.assert_array_equal(split["r"][m], np.arange(m, rows, num))
  merged = batches.merge_microbatches(split)
  np.testing.assert_array_equal(merged["x"], x)


def test_microbatches_must_divide_the_rows():
  with pytest.raises(ValueError, match="num_microbatches: 4 does not divide the batch of 6"):
    batches.split_microbatches(np.zeros((6, 2)), 4)


@pytest.mark.parametrize("cfg", [config.tiny(), config.tiny(family="qwen2",
                                                            tie_word_embeddings=False),
                                 config.preset("qwen3_1p7b"), config.preset("llama3_8b")])
def test_flops_per_token(cfg):
  untied = 0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size
  n = ref.decoder_params(cfg) - untied
  assert flops.matmul_params(cfg) == n
  want = 6 * n + 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * 1024
  assert flops.train_flops_per_token(cfg, 1024) == want
  assert flops.train_step_flops(cfg, 8, 1024) == 8 * 1024 * want


def test_qwen3_1p7b_flops_and_mfu():
  """Qwen3-1.7B: 1.72e9 matmul parameters (tied), 28 layers × 16 heads × 128 → 6.9 GFLOP
  per token of attention at 2,048 tokens of context."""
  cfg = config.preset("qwen3_1p7b")
  per_token = flops.train_flops_per_token(cfg, 2048)
  assert per_token == 6 * flops.matmul_params(cfg) + 12 * 28 * 16 * 128 * 2048
  assert abs(flops.matmul_params(cfg) / 1e9 - 1.72) < 0.01
  step = flops.train_step_flops(cfg, 16, 2048)
  assert flops.mfu(step, 2.0, 989e12) == pytest.approx(step / 2.0 / 989e12)
  with pytest.raises(ValueError, match="seconds"):
    flops.mfu(step, 0.0, 989e12)
