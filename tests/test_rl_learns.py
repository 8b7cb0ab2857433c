"""RL learns through the real trainer: SFT warm start, then GRPO on the doors bandit.

`tirjax.trainer.train.run` (`experiments.train`) does everything a user's run does (tokenizer,
tasks, SFT on demonstrations, JAX sampler, episodes, judge, `Rollouts`, estimator, jitted
policy step, hand-over, evaluation). SFT demonstrations pick every door equally often, so after
SFT the good door is sampled about one time in eight; only RL can raise that. The test asserts
a rise far outside the binomial noise of the SFT policy's success rate and the seed-to-seed
spread, over three seeds, and prints the margins.

Fault injection: `pytest tests/test_rl_learns.py --inject-fault=NAME` runs the same test with one
pipeline fault (`FAULTS`); each must make it fail. The results are in issue 13's closing note.

The mini-batch case (`MINIBATCH`: 4 updates per rollout batch, spec §5.1) also asserts that the
clip acts from the second update on, which the fault `fresh_old_logprobs` (π_old recomputed
before every update, so ρ = 1 always, as with one update per batch) must break; its effect on
learning is printed.
"""

import dataclasses
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import grpo
from tirjax.trainer import parts, stages
from tirjax.trainer.train import run
from tirjax.config import set_key
from tirjax.env import bandit
from tirjax.models.logprobs import token_logprobs
from tirjax.sampling.jax_sampler import JaxSampler
from tirjax.train_steps import packed

STEPS = 16
SETTINGS = {"sharding.num_devices": 1, "train.progress_bar": False, "train.export_final": False,
            "train.queries_per_step": 8, "train.eval_every": STEPS,
            "train.checkpoint_every": STEPS}


# 8 queries per step in mini-batches of 2: 4 updates per rollout batch.
MINIBATCH = {"train.mini_batch_queries": 2}


def doors_config(seed: int, extra=None):
  c = grpo.get_config(f"model=tiny,env=doors,steps={STEPS}")
  c.seed = seed
  for key, value in {**SETTINGS, **(extra or {})}.items():
    set_key(c, key, value)
  return c


# -- Faults: each rewrites one link of the path ----------------------------------------------


def _flip_sign(batch):
  return dataclasses.replace(batch, advantages=-batch.advantages)


def _shift_mask(batch):  # one token to the right: the door drops out, `<|im_end|>`'s next enters
  mask = jnp.roll(batch.loss_mask, 1, axis=1).at[:, 0].set(False)
  return dataclasses.replace(batch, loss_mask=mask)


def _other_rows_logprobs(batch):
  return dataclasses.replace(batch, old_logprobs=jnp.roll(batch.old_logprobs, 1, axis=0))


class _FreshOldLogprobs:
  """A train step whose batch's old log-probs are recomputed under the current parameters
  before every update: ρ = 1 at every update, so no clip can act. On the packed step (the
  default) the mini-batch's row slots are recomputed from its packed sequences."""

  def __init__(self, step, graphdef, chunk_size):
    self.step, self.placement, self.prepare = step, step.placement, step.prepare
    self.logp = jax.jit(lambda params, tokens, valid: token_logprobs(
        nnx.merge(graphdef, params), tokens, valid, chunk_size=chunk_size)[0])
    self.packed_logp = jax.jit(lambda params, seqs: packed.row_logprobs(
        nnx.merge(graphdef, params), seqs, chunk_size=chunk_size)[0])

  def __call__(self, state, batch):
    if isinstance(batch, packed.PackedBatch):
      fresh = self.packed_logp(state.params, batch.seqs)
      rows = batch.rows.replace(old_logprobs=jnp.where(batch.rows.loss_mask, fresh, 0.0))
      return self.step(state, batch.replace(rows=rows))
    fresh = self.logp(state.params, batch.tokens, batch.token_valid)
    return self.step(state, batch.replace(old_logprobs=jnp.where(batch.token_valid, fresh, 0.0)))


BATCH_FAULTS = {"sign": _flip_sign, "mask_shift": _shift_mask, "old_logprobs_row": _other_rows_logprobs}
FAULTS = (*BATCH_FAULTS, "stale_weights", "fresh_old_logprobs")


@pytest.fixture
def fault(request, monkeypatch):
  name = request.config.getoption("--inject-fault")
  if name is None:
    return None
  if name not in FAULTS:
    raise pytest.UsageError(f"--inject-fault: one of {FAULTS}, got {name!r}")
  if name in BATCH_FAULTS:
    corrupt, build = BATCH_FAULTS[name], stages.policy_batch
    monkeypatch.setattr(stages, "policy_batch", lambda *args: corrupt(build(*args)))
  elif name == "fresh_old_logprobs":
    make_step = parts.policy_step
    monkeypatch.setattr(parts, "policy_step", lambda graphdef, tx, place, loss, opts: (
        _FreshOldLogprobs(make_step(graphdef, tx, place, loss, opts), graphdef,
                          opts.logprob_chunk_size)))
  else:  # the sampler keeps the weights it was first given (those after SFT)
    update = JaxSampler.update

    def first_update_only(self, params, version):
      if not getattr(self, "_had_update", False):
        self._had_update = True
        update(self, params, version)

    monkeypatch.setattr(JaxSampler, "update", first_update_only)
  return name


def rl_records(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r for r in map(json.loads, f) if r["phase"] == "rl"]


SEEDS = (0, 1, 2)
ROWS = 8 * 8  # queries per step × rows per query (grpo: n = 8)


@pytest.mark.slow
@pytest.mark.parametrize("updates", ["single", "minibatch"])
def test_grpo_learns_the_good_door_after_sft(tmp_path, fault, updates):
  """Three seeded runs (SFT, then 16 GRPO steps): each raises its training accuracy from
  about chance to near 1, far outside both the binomial noise of a policy that stays put and
  the seed-to-seed spread of the gains; greedy evaluation then opens the good door in every
  room. With 4 mini-batches per rollout batch, the clip acts after the first update."""
  gains, report, clipped = [], [], []
  for seed in SEEDS:
    extra = MINIBATCH if updates == "minibatch" else {}
    summary = run(doors_config(seed, extra), str(tmp_path / f"seed{seed}"))
    records = rl_records(tmp_path / f"seed{seed}")
    acc = np.array([r["train/accuracy"] for r in records])
    start, end = acc[:2].mean(), acc[-4:].mean()
    gains.append(end - start)
    report.append((seed, start, end, summary["after_sft"]["eval/accuracy"],
                   summary["after_rl"]["eval/accuracy"]))
    assert all(r["updates/count"] == (4 if updates == "minibatch" else 1) for r in records)
    clipped.append(max(r["updates/last/clip_frac_low"] + r["updates/last/clip_frac_high"]
                       for r in records))
  gains = np.array(gains)
  chance = 1 / len(bandit.DOORS)
  # A policy that stays at chance: the binomial noise of a 4-step mean minus a 2-step mean.
  binomial = math.sqrt(chance * (1 - chance) * (1 / (4 * ROWS) + 1 / (2 * ROWS)))
  spread = float(gains.std(ddof=1))
  print(f"\ndoors, fault={fault}:")
  for seed, start, end, sft_eval, rl_eval in report:
    print(f"  seed {seed}: train accuracy {start:.3f} -> {end:.3f} (steps 1-2 -> "
          f"{STEPS - 3}-{STEPS}), greedy eval {sft_eval:.3f} -> {rl_eval:.3f}")
  print(f"  gain {gains.mean():+.3f} (min {gains.min():+.3f}); seed-to-seed std {spread:.3f}; "
        f"margin {gains.min() / binomial:.1f} binomial sigmas, "
        f"{gains.mean() / max(spread, 1e-9):.1f} seed-to-seed sigmas; largest clip fraction "
        f"at a step's last update per seed {np.round(clipped, 4).tolist()}")
  if updates == "minibatch":  # the policy moved between updates, and the clip acted
    assert min(clipped) > 0
  for seed, start, end, sft_eval, rl_eval in report:
    assert start < 0.4, seed  # SFT taught no door: RL has the whole way to go
    assert rl_eval == 1.0, seed  # greedy opens the good door in every room
  assert gains.min() > 0.4 and gains.min() > 10 * binomial
  assert gains.mean() > 5 * spread
