"""The padded and the packed update of one batch, in one process or several (issue 38):
what `tests/test_packed_processes.py` compares across process counts.

    python -m tirjax.testing.packed_processes --out=DIR                       # one process
    python -m tirjax.testing.packed_processes --out=DIR --num_processes=2 \\
        --process_id=P --coordinator=localhost:PORT                          # each of two

The global batch is two halves of every kind of group (`strategies.mixed_rollouts`, seeds 0
and 1); with two processes each samples its own half, as `experiments.train` does, and the
global arrays are assembled from both (`StepShare.global_rollouts`). Then, on the mesh of
every process's devices: the packed KL reference pass, and one pass of 2 mini-batches of
whole groups (each holding both processes' rows) with the padded step and with the packed
one. Process 0 writes DIR/result.npz: each update's loss and the last update's gradients
per variant, and the reference log-probs. Then one SFT step on demonstrations that share a
system prompt (`train_setup.demonstrations`; every process holds the whole batch, as the
trainer's do, and packs its own rows), padded and packed: `sft_<variant>/loss` and its
gradients.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np
from absl import app, flags
from jax.experimental import multihost_utils

from tirjax import advantages, distributed, loss, sharding, train_steps
from tirjax.models import decoder
from tirjax.testing import strategies, train_setup as ts
from tirjax.testing.reference import train_step as ref
from tirjax.train_steps.minibatches import update_passes

flags.DEFINE_string("out", None, "Directory of result.npz.")
flags.DEFINE_integer("num_processes", 1, "Processes.")
flags.DEFINE_integer("process_id", 0, "This process.")
flags.DEFINE_string("coordinator", "", "host:port of process 0 (several processes).")
FLAGS = flags.FLAGS

HALF = 16  # rows per half: trees of 4 and 3 rows, independent groups of 3 and 1, general 4
LOSS = loss.LossOptions(kl_coef=0.05, entropy_coef=0.01, clip_high=0.28)
PADDED = train_steps.StepOptions(logprob_chunk_size=32)
PACKED = dataclasses.replace(PADDED, packed=True, attention_block=8, max_tokens_per_microbatch=32)


def half(seed: int):
  return strategies.mixed_rollouts(np.random.default_rng(seed), (4, 3), (3, 1), (4,),
                                   num_rows=HALF, prompt_tokens=7, step_tokens=3,
                                   response_tokens=2, vocab_size=ts.VOCAB)


def moved(r, start: int):
  """`r`'s batch-wide ids moved to rows from `start` (as `StepShare.global_rollouts` does)."""
  node = np.asarray(r.node_id)
  return r.replace(group_id=np.asarray(r.group_id) + start,
                   node_id=np.where(node >= 0, node + start * r.max_steps, -1))


def global_batch(mesh):
  """The two halves as one global batch, each process contributing its own."""
  if distributed.is_multiprocess():
    p = jax.process_index()
    local = moved(half(p), p * HALF)
  else:
    local = jax.tree.map(lambda a, b: np.concatenate([np.asarray(a), np.asarray(b)]),
                         half(0), moved(half(1), HALF))
  return sharding.shard_batch(local, mesh, sharding.DEFAULT_RULES)


def main(argv):
  del argv
  distributed.initialize(distributed.DistributedOptions(
      num_processes=FLAGS.num_processes, process_id=FLAGS.process_id,
      coordinator_address=FLAGS.coordinator))
  graphdef, params, tx, place, _ = ts.setup((len(jax.devices()), 1, 1))
  r = global_batch(place.mesh)
  _, ref_params = train_steps.split_model(decoder.init(ts.CONFIG, 1))
  reference = train_steps.ReferencePolicy(graphdef, ref_params, place, PACKED)
  r = train_steps.with_reference_logprobs(r, reference, LOSS)
  spec = advantages.get("portool")
  batch = train_steps.policy_batch(r, spec(r, spec.make_options({})))
  gid, valid = distributed.host_rows(r.group_id), distributed.host_rows(r.row_valid)
  out = {"ref_logprobs": distributed.host_rows(r.ref_logprobs),
         "loss_mask": distributed.host_rows(r.loss_mask)}
  for name, opts in (("padded", PADDED), ("packed", PACKED)):
    state = train_steps.init_state(params, tx, place, jax.random.key(0))
    step = train_steps.policy_step(graphdef, tx, place, LOSS, opts)
    state, updates = update_passes(state, step, batch, gid, valid, 2, 1, seed=0, step=0)
    grads = multihost_utils.process_allgather(state.opt_state[0].grads, tiled=True)
    out[f"{name}/losses"] = np.asarray([float(u["loss"]) for u in updates])
    out[f"{name}/forwarded"] = np.asarray([float(u["tokens/forwarded"]) for u in updates])
    for i, g in enumerate(ref.flatten(grads)):
      out[f"{name}/grad{i}"] = g
  demos = ts.demonstrations(np.random.default_rng(5), rows=2 * HALF)
  for name, opts in (("padded", PADDED), ("packed", PACKED)):
    state = train_steps.init_state(params, tx, place, jax.random.key(0))
    step = train_steps.sft_step(graphdef, tx, place, train_steps.SFTLossOptions(), opts)
    state, metrics = step(state, demos)
    grads = multihost_utils.process_allgather(state.opt_state[0].grads, tiled=True)
    out[f"sft_{name}/loss"] = np.asarray(float(metrics["loss"]))
    out[f"sft_{name}/forwarded"] = np.asarray(float(metrics["tokens/forwarded"]))
    for i, g in enumerate(ref.flatten(grads)):
      out[f"sft_{name}/grad{i}"] = g
  if distributed.is_primary():
    os.makedirs(FLAGS.out, exist_ok=True)
    np.savez(os.path.join(FLAGS.out, "result.npz"), **out)
  distributed.barrier("done")


if __name__ == "__main__":
  flags.mark_flag_as_required("out")
  app.run(main)
