"""k-step off-policy rollouts (`train.max_staleness`, `tirjax.trainer.staleness`, issue 55):
the queue's schedule, the decoupled objective on rows of known policy versions against its
loop reference, the option's checks, and the trainer end to end (k = 0 unchanged, k >= 1
stale by the schedule and reproducible, a kill/resume bit-exact with the queue saved beside
each checkpoint, refused by name without it)."""

import json
import os
import subprocess
import threading

import jax
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from safetensors.numpy import load_file

from tirjax import advantages, loss, train_steps

from tirjax.loss.rollout_correction import RolloutCorrectionOptions as RC
from tirjax.rundir import RunDir
from tirjax.testing import train_setup as ts
from tirjax.testing.reference import decoupled as ref
from tirjax.testing.short_runs import (checkpoint_steps, kill_at_every_checkpoint, killed_at,
                                      short_config, train_command)
from tirjax.trainer import resolve, samplers, stages, staleness
from tirjax.trainer.staleness import SampleQueue, staleness_metrics
from tirjax.trainer.train import run

# -- The schedule -------------------------------------------------------------------------------


def schedule(k, steps):
  """Drives a queue as the RL loop does (the sampler holds θ_t at step t); returns, per step,
  the version that sampled its batch and how often each step was sampled."""
  queue, held, sampled_by, times = SampleQueue(k), [0], {}, {}

  def sample(j):
    sampled_by[j] = held[0]
    times[j] = times.get(j, 0) + 1
    return j

  for t in range(steps):
    held[0] = t  # the hand-over of θ_t
    assert queue.take(t, steps, sample) == t
    assert set(queue.batches) == set(range(t + 1, min(t + k, steps - 1) + 1))
  return sampled_by, times


@settings(max_examples=40, deadline=None)
@given(k=st.integers(1, 5), steps=st.integers(1, 12))
def test_step_t_is_sampled_by_the_weights_of_step_t_minus_k(k, steps):
  sampled_by, times = schedule(k, steps)
  assert sampled_by == {t: max(t - k, 0) for t in range(steps)}
  assert times == {t: 1 for t in range(steps)}  # each step sampled once


@settings(max_examples=20, deadline=None)
@given(k=st.integers(1, 4), steps=st.integers(1, 9))
def test_sampling_ahead_in_a_thread_keeps_the_schedule(k, steps):
  """With the thread, each step is still sampled once, by the weights of step t − k, in step
  order, and only the step being taken is sampled in the caller's thread."""
  main = threading.get_ident()
  queue, held, sampled_by, order, where = SampleQueue(k, ahead=True), [0], {}, [], {}

  def sample(j):
    sampled_by[j] = held[0]
    order.append(j)
    where[j] = threading.get_ident() == main
    return j

  try:
    for t in range(steps):
      queue.settle()  # as the loop does before each hand-over
      held[0] = t
      assert queue.take(t, steps, sample) == t
    queue.settle()
  finally:
    queue.close()
  assert sampled_by == {t: max(t - k, 0) for t in range(steps)}
  assert order == list(range(steps))
  assert where == {t: t == 0 for t in range(steps)}
  assert set(queue.seconds()) == {"time/wait_rollouts_s", "time/sample_ahead_s",
                                  "time/sampler_wait_weights_s"}


def test_a_sampling_error_in_the_thread_is_raised_by_settle():
  queue = SampleQueue(1, ahead=True)

  def sample(j):
    if j == 1:
      raise RuntimeError("sampler died at step 1")
    return j

  try:
    assert queue.take(0, 3, sample) == 0
    with pytest.raises(RuntimeError, match="sampler died at step 1"):
      queue.settle()
  finally:
    queue.close()


def test_the_queue_refuses_bad_k_and_steps_out_of_order():
  for k in (0, -1, 1.0, True):
    with pytest.raises(ValueError, match="max_staleness"):
      SampleQueue(k)
  queue = SampleQueue(2)
  queue.take(0, 5, lambda j: j)
  with pytest.raises(ValueError, match="step 3: the queue holds steps"):
    queue.take(3, 5, lambda j: j)
  with pytest.raises(ValueError, match="outside the run's RL steps"):
    queue.take(5, 5, lambda j: j)


def test_staleness_counts_valid_rows_behind_the_trainers_version():
  r = ts.tiny_rollouts()
  versions = np.arange(r.num_rows, dtype=np.int32) % 3
  valid = np.ones(r.num_rows, bool)
  valid[0] = False  # version 0, staleness 4: left out
  r = r.replace(policy_version=versions, row_valid=valid)
  s = 4 - versions[1:]
  assert staleness_metrics(4, r) == {"staleness/mean": pytest.approx(s.mean()),
                                     "staleness/max": int(s.max())}
  assert staleness_metrics(4, r.replace(row_valid=np.zeros(r.num_rows, bool))) == {
      "staleness/mean": 0.0, "staleness/max": 0}


# -- The decoupled objective on rows of known versions ------------------------------------------

STEP = train_steps.StepOptions(num_microbatches=2, logprob_chunk_size=32)
MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")


@pytest.fixture(scope="module")
def versions():
  """Four policies (tiny models of seeds 0..3) as versions 0..3 and their log-probs of one
  batch's tokens: 0 and 1 sampled its rows, 2 is the trainer's (π_prox), 3 the π_θ being
  updated."""
  graphdef, _, _, place, _ = ts.setup()
  own = train_steps.TokenLogprobs(graphdef, place, STEP)
  r = ts.tiny_rollouts()
  states = [ts.setup(seed=v)[4] for v in range(4)]
  logps = [np.asarray(train_steps.with_policy_logprobs(r, own, s.params).old_logprobs)
           for s in states]
  return r, own, states, logps


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("cap", [1.05, 2.0])
def test_decoupled_loss_on_rows_of_known_versions_matches_the_reference(versions, mode, cap):
  """The trainer's loss inputs (`stages.loss_inputs`: π_prox recomputed with its weights, each
  row's behaviour log-probs as its own version sampled them) in the policy loss with the
  token correction are the reference's decoupled objective."""
  r, own, states, logps = versions
  row_version = np.arange(r.num_rows) % 2  # rows of versions 0 and 1
  sampled = r.replace(old_logprobs=np.where(row_version[:, None] == 0, logps[0], logps[1]),
                      policy_version=row_version.astype(np.int32))
  opts = loss.LossOptions(aggregation=mode, rollout_correction=RC(is_level="token",
                                                                   is_threshold=cap))
  rollouts, behaviour = stages.loss_inputs(sampled, None, own, states[2], opts)
  adv = advantages.get("grpo")(rollouts)
  got = loss.policy_loss(logps[3], rollouts.old_logprobs, adv.tokens, rollouts.loss_mask,
                         adv.row_mask, opts, sampler_logprobs=behaviour)
  want = ref.decoupled_pg_loss(
      logps[3].tolist(), logps[2].tolist(), {0: logps[0].tolist(), 1: logps[1].tolist()},
      row_version.tolist(), np.asarray(adv.tokens).tolist(), np.asarray(r.loss_mask).tolist(),
      np.asarray(adv.row_mask).tolist(), cap=cap, mode=mode)
  assert float(got.pg.value) == pytest.approx(want, rel=1e-5, abs=1e-7)
  # the versions do differ here: every behaviour weight 1 would give another loss
  assert want != pytest.approx(ref.decoupled_pg_loss(
      logps[3].tolist(), logps[2].tolist(), {0: logps[2].tolist(), 1: logps[2].tolist()},
      row_version.tolist(), np.asarray(adv.tokens).tolist(), np.asarray(r.loss_mask).tolist(),
      np.asarray(adv.row_mask).tolist(), cap=cap, mode=mode), rel=1e-5, abs=1e-7)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), versions_n=st.integers(1, 4),
       gap=st.sampled_from([0.0, 0.05, 0.5, 3.0, 40.0]), mode=st.sampled_from(MODES),
       cap=st.sampled_from([1.0, 1.5, 4.0]))
def test_decoupled_loss_on_random_ragged_batches_matches_the_reference(seed, versions_n, gap,
                                                                       mode, cap):
  """Random rows of 1..4 versions, ragged masks (a row without loss tokens, rows out of the
  loss), NaN and ±inf off the mask, gaps up to 40 nats: finite, and the reference's."""
  B, L = 6, 8
  rng = np.random.default_rng(seed)
  prox = rng.normal(-2.0, 1.0, (B, L)).astype(np.float32)
  tables = {v: (prox + rng.normal(0, gap, (B, L))).astype(np.float32) for v in range(versions_n)}
  row_version = rng.integers(0, versions_n, B)
  mask = rng.random((B, L)) < 0.7
  mask[0] = False
  behaviour = np.stack([tables[v][b] for b, v in enumerate(row_version)])
  behaviour[~mask] = rng.choice([np.nan, np.inf, -np.inf], size=(~mask).sum())
  logp = np.where(mask, prox + rng.normal(0, 0.3, (B, L)), 0.0).astype(np.float32)
  adv = np.where(mask, rng.normal(0, 1, (B, L)), 0.0).astype(np.float32)
  row_mask = rng.random(B) < 0.85
  opts = loss.LossOptions(aggregation=mode, rollout_correction=RC(is_level="token",
                                                                   is_threshold=cap))
  got = float(loss.policy_loss(logp, prox, adv, mask, row_mask, opts,
                               sampler_logprobs=behaviour).pg.value)
  want = ref.decoupled_pg_loss(logp.tolist(), prox.tolist(),
                               {v: t.tolist() for v, t in tables.items()}, row_version.tolist(),
                               adv.tolist(), mask.tolist(), row_mask.tolist(), cap=cap,
                               mode=mode)
  assert np.isfinite(got)
  assert got == pytest.approx(want, rel=1e-4, abs=1e-6)


# -- The option ---------------------------------------------------------------------------------


@pytest.mark.parametrize("extra, key", [
    ({"train.max_staleness": -1}, "train.max_staleness: must be an integer >= 0"),
    ({"train.max_staleness": 1}, "loss.rollout_correction.is_level: train.max_staleness=1"),
    ({"train.max_staleness": 1, "loss.rollout_correction.is_level": "sequence"},
     "loss.rollout_correction.is_level"),
    ({"train.max_staleness": 2, "loss.rollout_correction.is_level": "token",
      "sampler.kind": "vllm"}, "sampler.kind: train.max_staleness=2"),
])
def test_bad_or_unbuilt_settings_are_refused_by_name(extra, key):
  c = short_config("grpo", **extra)
  with pytest.raises(resolve.ConfigError, match=key.replace(".", r"\.")):
    resolve.resolve(c)


@pytest.mark.parametrize("name, what", [("ppo", "critic"), ("igpo", "answer probes")])
def test_k_above_0_refuses_what_it_is_not_built_for(name, what):
  c = short_config(name, **{"train.max_staleness": 1,
                            "loss.rollout_correction.is_level": "token"})
  with pytest.raises(resolve.ConfigError, match=f"train.max_staleness: 1 .*{what}"):
    resolve.resolve(c)


def test_token_correction_with_k_resolves_and_k_defaults_to_0():
  assert resolve.resolve(short_config("grpo")).train.max_staleness == 0
  exp = resolve.resolve(short_config("grpo", **{"train.max_staleness": 3,
                                                "loss.rollout_correction.is_level": "token",
                                                "loss.rollout_correction.mask_level": "sequence"}))
  assert exp.train.max_staleness == 3


def test_a_saved_queue_loads_as_saved_and_a_missing_or_corrupt_one_is_named(tmp_path):
  r = ts.tiny_rollouts()
  batches = {4: stages.StepBatch(r, r, [], {"x": 1.0}, 0), 5: stages.StepBatch(r, r, [], {}, 2)}
  staleness.save_queue(str(tmp_path), 4, batches)
  back = staleness.load_queue(str(tmp_path), 4, k=2)
  assert sorted(back) == [4, 5] and back[5].extra_rounds == 2 and back[4].stats == {"x": 1.0}
  for a, b in zip(jax.tree.leaves(back[4].rollouts), jax.tree.leaves(r)):
    np.testing.assert_array_equal(a, b)
  staleness.check_resumable(str(tmp_path), 2, 4, rl_step=3, steps=6)  # it exists
  staleness.check_resumable(str(tmp_path), 2, 9, rl_step=0, steps=6)  # nothing queued yet
  staleness.check_resumable(str(tmp_path), 0, 9, rl_step=3, steps=6)  # k = 0: no queue
  with pytest.raises(RuntimeError, match="cannot resume at RL step 3 of 6.*9.pkl"):
    staleness.check_resumable(str(tmp_path), 2, 9, rl_step=3, steps=6)
  with pytest.raises(RuntimeError, match="7.pkl is missing"):
    staleness.load_queue(str(tmp_path), 7, k=2)
  path = tmp_path / staleness.QUEUE_DIR / "4.pkl"
  raw = bytearray(path.read_bytes())
  raw[-10] ^= 0xFF
  path.write_bytes(bytes(raw))
  with pytest.raises(RuntimeError, match="4.pkl fails its checksum"):
    staleness.load_queue(str(tmp_path), 4, k=2)
  assert path.read_bytes() == bytes(raw)  # left as it is


def test_queue_files_of_deleted_checkpoints_are_pruned(tmp_path):
  for step in (1, 2, 3, 4):
    staleness.save_queue(str(tmp_path), step, {})
  staleness.prune_queues(str(tmp_path), kept=[2, 3], below=4)
  assert sorted(p.name for p in (tmp_path / staleness.QUEUE_DIR).iterdir()) == [
      "2.pkl", "3.pkl", "4.pkl"]


# -- The trainer end to end ---------------------------------------------------------------------

# an entropy bonus moves the weights even where every reward of the tiny model is the same
# (no advantage): the versions then differ
STALE = {"train.export_final": False, "loss.rollout_correction.is_level": "token",
         "loss.entropy_coef": 0.01}


def _rl(workdir):
  return RunDir(str(workdir)).metrics("rl")


def _timeless(records):
  return [{k: v for k, v in r.items() if not (k.startswith("time") or k.endswith("_s"))}
          for r in records]


@pytest.mark.slow
def test_k0_is_the_synchronous_loop(tmp_path):
  """k = 0 given and k absent: the same run (every metric bit for bit), every row sampled by
  the weights that train on it (staleness 0)."""
  run(short_config("grpo", steps=3, **STALE), str(tmp_path / "absent"))
  run(short_config("grpo", steps=3, **STALE, **{"train.max_staleness": 0}), str(tmp_path / "k0"))
  a, b = _rl(tmp_path / "absent"), _rl(tmp_path / "k0")
  assert [r["step"] for r in a] == [1, 2, 3]
  assert _timeless(a) == _timeless(b)
  assert all(r["staleness/max"] == 0 and r["staleness/mean"] == 0 for r in a)
  # the sampler's log-probs are the trainer's weights': TIS weights 1 within kernel rounding
  assert all(abs(r["rollout_corr/weight_max"] - 1) < 1e-5 for r in a)


@pytest.mark.slow
def test_k2_trains_on_rows_k_versions_old_and_is_reproducible(tmp_path):
  """k = 2 over 4 steps: step t's rows are min(t, 2) versions behind (the warm start's for the
  first two); the weights then differ from 1 (the gap of older weights), and a second run of
  the same seed, sampling every step in the loop's own thread instead of the background one,
  logs the same metrics bit for bit: the thread changes the wall time only."""
  k, steps = 2, 4
  config = lambda: short_config("grpo", steps=steps, **STALE, **{"train.max_staleness": k})
  run(config(), str(tmp_path / "a"))
  with pytest.MonkeyPatch.context() as mp:  # the steps ahead sampled in the loop's thread
    mp.setattr(staleness, "SampleQueue", lambda k, ahead: SampleQueue(k, ahead=False))
    run(config(), str(tmp_path / "b"))
  a, b = _rl(tmp_path / "a"), _rl(tmp_path / "b")
  assert [r["staleness/max"] for r in a] == [min(t, k) for t in range(steps)]
  assert [r["staleness/mean"] for r in a] == [min(t, k) for t in range(steps)]
  assert abs(a[0]["rollout_corr/weight_max"] - 1) < 1e-5  # step 0: θ_0 on θ_0's rows
  assert all(r["rollout_corr/gap_max"] > 1e-3 for r in a[1:])
  assert _timeless(a) == _timeless(b)


@pytest.mark.slow
def test_step_t_plus_k_is_sampled_while_step_t_updates_and_never_across_a_hand_over(
    tmp_path, monkeypatch):
  """k = 1. Step t + 1's sampling, in the background thread, starts once step t's update has
  started: it runs beside the update (sampled in the loop's thread, it would wait for an
  update that cannot start). It then holds its rows until the loop, its update done, next
  reaches the queue or the sampler: at that point no hand-over may find it in flight (the loop
  settles the queue first), or the rows would mix two versions' tokens."""
  main, started, reached, seen, crossed = threading.get_ident(), {}, {}, {}, []
  in_flight, armed = [0], [None]
  event = lambda events, step: events.setdefault(step, threading.Event())
  update_passes, sample, settle = stages.update_passes, stages.sample, SampleQueue.settle
  make_sampler = samplers.make_sampler

  def reach():  # the loop's first touch of the queue or the sampler after an update
    if armed[0] is not None:
      event(reached, armed[0]).set()
      armed[0] = None

  def updating(state, *args, step, **kwargs):
    event(started, step).set()
    out = update_passes(state, *args, step=step, **kwargs)
    armed[0] = step
    return out

  def sampling(trainer, j):
    if j == 0:
      return sample(trainer, j)
    in_flight[0] += 1
    try:
      seen[j] = (event(started, j - 1).wait(timeout=300), threading.get_ident() != main,
                 event(reached, j - 1).wait(timeout=300))
      return sample(trainer, j)
    finally:
      in_flight[0] -= 1

  class Watched:
    """The run's sampler, each hand-over checked for a sampling in flight."""

    def __init__(self, inner):
      self.inner = inner

    def __getattr__(self, name):
      return getattr(self.inner, name)

    def update(self, *args, **kwargs):
      crossed.append(in_flight[0] > 0)
      reach()
      return self.inner.update(*args, **kwargs)

  monkeypatch.setattr(stages, "update_passes", updating)
  monkeypatch.setattr(stages, "sample", sampling)
  monkeypatch.setattr(SampleQueue, "settle", lambda queue: (reach(), settle(queue))[1])
  monkeypatch.setattr(samplers, "make_sampler", lambda *a, **kw: Watched(make_sampler(*a, **kw)))
  run(short_config("grpo", steps=3, **STALE, **{"train.max_staleness": 1}), str(tmp_path))
  assert seen == {1: (True, True, True), 2: (True, True, True)}
  assert crossed and not any(crossed)
  records = _rl(tmp_path)
  assert all(r["time/sample_ahead_s"] > 0 for r in records[:2])
  assert records[2]["time/sample_ahead_s"] == 0  # the last step samples nothing ahead


@pytest.mark.slow
def test_a_k1_run_resumes_bit_exact_from_every_checkpoint(tmp_path):
  """k = 1, killed (SIGKILL, by itself) once each checkpoint is committed and started again
  each time: every resume trains on the queue saved with its checkpoint (rows of the weights
  one step older), and the run logs what the uninterrupted run logs and ends with its
  parameters, bit for bit. Then a queue file deleted: the resume is refused by name and the
  run directory left as it was."""
  env = {**os.environ, "PYTHONPATH": os.getcwd()}
  settings_ = {**STALE, "train.max_staleness": 1, "train.export_final": True,
               "train.keep_checkpoints": 20}
  extra = [f"--config.{k}={v}" for k, v in settings_.items()]
  command = lambda workdir: train_command(workdir, 3) + extra
  full, killed = tmp_path / "full", tmp_path / "killed"
  subprocess.run(command(full), check=True, env=env, capture_output=True)
  saved = checkpoint_steps(full)
  outputs = kill_at_every_checkpoint(lambda w: [command(w)], killed, saved, env)
  assert sum("resumed " in out for out in outputs) == len(saved) - 1
  subprocess.run(command(killed), check=True, env=env, capture_output=True)
  a, b = _rl(full), _rl(killed)
  assert [r["staleness/max"] for r in a] == [0, 1, 1]
  assert _timeless(RunDir(str(full)).metrics()) == _timeless(RunDir(str(killed)).metrics())
  pa = load_file(str(full / "hf_export" / "model.safetensors"))
  pb = load_file(str(killed / "hf_export" / "model.safetensors"))
  assert pa.keys() == pb.keys()
  for k in pa:
    np.testing.assert_array_equal(pa[k], pb[k], err_msg=k)
  # killed inside RL, its queue file gone: refused, nothing changed
  lost = tmp_path / "lost"
  subprocess.run(killed_at(command(lost), 2), env=env, capture_output=True)
  assert checkpoint_steps(lost)[-1] == 2
  (lost / staleness.QUEUE_DIR / "2.pkl").unlink()
  before = (lost / "metrics.jsonl").read_bytes()
  out = subprocess.run(command(lost), env=env, capture_output=True, text=True)
  assert out.returncode != 0
  assert "train.max_staleness=1: cannot resume at RL step" in out.stderr, out.stderr[-2000:]
  assert (lost / "metrics.jsonl").read_bytes() == before
  assert checkpoint_steps(lost)[-1] == 2
  assert json.load(open(lost / "status.json"))["state"] == "failed"
