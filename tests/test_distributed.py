"""`tirjax.distributed` in one process (8 simulated devices): its options, the identities it
reduces to, how per-process statistics combine, and where a process's rows lie. The
two-process runs are in `test_multiprocess.py`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from configs import grpo
from tirjax import distributed, sharding
from tirjax.trainer import processes, resolve
from tirjax.rundir import NullWriter
from tirjax.sampling.interface import SamplingParams


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_processes=-1), "num_processes"),
    (dict(num_processes=2, process_id=2), "process_id: 2 is not below"),
    (dict(process_id=-2), "process_id"),
    (dict(coordinator_address="host0"), "host:port"),
    (dict(cpu_collectives="nccl"), "cpu_collectives"),
])
def test_bad_options_name_the_key(kwargs, message):
  with pytest.raises(ValueError, match=message):
    distributed.DistributedOptions(**kwargs)


def test_the_config_section_is_checked_by_key():
  c = grpo.get_config("model=tiny")
  assert resolve.distributed_options(c) == distributed.DistributedOptions()
  c.distributed.process_id = 5
  c.distributed.num_processes = 2
  with pytest.raises(resolve.ConfigError, match="distributed: process_id"):
    resolve.distributed_options(c)


def test_queries_must_divide_over_the_processes(monkeypatch):
  c = grpo.get_config("model=tiny")
  c.train.queries_per_step = 3
  c.train.mini_batch_queries = 1
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  with pytest.raises(resolve.ConfigError, match="train.queries_per_step: 3 queries do not "
                     "divide over the 2 processes"):
    resolve.resolve(c)


def test_one_process_is_the_identity():
  distributed.initialize(distributed.DistributedOptions())  # nothing to start
  assert not distributed.is_multiprocess() and distributed.is_primary()
  distributed.barrier("nothing")
  assert distributed.agree(7) == 7 and distributed.global_max(3) == 3
  assert distributed.allgather_objects({"a": [1]}) == [{"a": [1]}]
  assert distributed.task_block(5) == (0, 5)
  stats = {"reward/mean": 0.5, "rows/valid": 8}
  assert distributed.reduce_stats(stats) == stats
  mesh = sharding.make_mesh()
  assert distributed.row_share(mesh, sharding.DEFAULT_RULES, 16) == (0, 1, 0, 16)
  assert distributed.row_share(mesh, sharding.DEFAULT_RULES, 16).of([1, 2, 3]) == [1, 2, 3]


def test_statistics_combine_by_kind():
  a = {"reward/mean": 0.25, "rows/valid": 8, "advantage/step_min": -1.0,
       "advantage/step_max": 2.0, "time/update_s": 3.0, "rollout/sampled_tokens": 100,
       "rollout/sampler_s": 1.0, "eval/stage": "sft"}
  b = {"reward/mean": 0.75, "rows/valid": 6, "advantage/step_min": -2.0,
       "advantage/step_max": 1.0, "time/update_s": 4.0, "rollout/sampled_tokens": 50,
       "rollout/sampler_s": 2.5, "eval/stage": "sft"}
  out = distributed.combine_stats([a, b])
  assert out == {"reward/mean": 0.5, "rows/valid": 14, "advantage/step_min": -2.0,
                 "advantage/step_max": 2.0, "time/update_s": 4.0,
                 "rollout/sampled_tokens": 150, "rollout/sampler_s": 2.5, "eval/stage": "sft"}


def test_local_rows_and_local_replica_read_a_sharded_array_whole():
  mesh = sharding.make_mesh(sharding.ShardingOptions(mesh=(("data", 4), ("fsdp", 2),
                                                           ("tensor", 1))))
  x = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
  rows = jax.device_put(x, NamedSharding(mesh, PartitionSpec(("data", "fsdp"))))
  np.testing.assert_array_equal(distributed.local_rows(rows), x)
  params = {"w": jax.device_put(x, NamedSharding(mesh, PartitionSpec("fsdp"))),
            "b": jax.device_put(x[0], NamedSharding(mesh, PartitionSpec()))}
  copy = distributed.local_replica(params)
  for k in params:
    assert len(copy[k].sharding.device_set) == 1  # whole on one device: a sampler's copy
    np.testing.assert_array_equal(np.asarray(copy[k]), np.asarray(params[k]))
  one = {"w": jnp.ones(3)}
  assert distributed.local_replica(one)["w"] is not one["w"]  # a copy: steps donate theirs


@pytest.mark.parametrize("name", ["portool", "hidifftir", "grpo"])
def test_process_shares_make_the_batch_the_whole_would(monkeypatch, name):
  """Two processes' shares, their group and node ids moved to their blocks, are one batch:
  every group-relative estimator gives each share what it gives the share alone (no group or
  tree node of process 0 merges with one of process 1)."""
  from tirjax import advantages, rollouts as rollouts_lib  # noqa: PLC0415
  from tirjax.testing.synthetic import tree_rollouts  # noqa: PLC0415
  rng = np.random.default_rng(0)
  shares = [tree_rollouts(rng, [3, 2], max_depth=3, num_rows=6, max_steps=3,
                          outcome_probs=(0.4, 0.2, 0.4)) for _ in range(2)]
  monkeypatch.setattr(distributed, "is_multiprocess", lambda: True)
  monkeypatch.setattr(sharding, "shard_batch", lambda batch, mesh, rules: batch)
  moved = [processes.StepShare(distributed.RowShare(p, 2, 6 * p, 6 * (p + 1)), rollout=None,
                                queries=1, mesh=None, rules=None).global_rollouts(r)
           for p, r in enumerate(shares)]
  parts = [rollouts_lib.to_numpy(m) for m in moved]
  whole = rollouts_lib.from_numpy({k: np.concatenate([p[k] for p in parts]) for k in parts[0]})
  estimator = advantages.get(name)
  together = estimator(whole)
  for p, r in enumerate(shares):
    alone = estimator(r)
    np.testing.assert_allclose(np.asarray(together.tokens)[6 * p:6 * (p + 1)],
                               np.asarray(alone.tokens), atol=1e-6)
    np.testing.assert_array_equal(np.asarray(together.row_mask)[6 * p:6 * (p + 1)],
                                  np.asarray(alone.row_mask))


def test_row_ids_are_checked():
  with pytest.raises(ValueError, match="row_ids: must be distinct"):
    SamplingParams(row_ids=(1, 1))
  with pytest.raises(ValueError, match="row_ids: must be distinct"):
    SamplingParams(n=4, row_ids=(2**30,))


def test_null_writer_builds_records_and_writes_nothing(tmp_path):
  w = NullWriter()
  w.truncate_after({"rl": 0})
  rec = w.write("sft", 3, {"loss": np.float32(0.5)})
  assert rec["loss"] == 0.5 and rec["step"] == 3
  w.close()
  assert not list(tmp_path.iterdir())


def test_each_process_takes_its_own_vllm_servers():
  from tirjax.trainer.samplers import own_servers  # noqa: PLC0415
  urls = ["http://a:1", "http://b:1", "http://c:1", "http://d:1"]
  assert own_servers(urls, 0, 2) == ["http://a:1", "http://c:1"]
  assert own_servers(urls, 1, 2) == ["http://b:1", "http://d:1"]
  with pytest.raises(ValueError, match="4 server\\(s\\) for 8 processes"):
    own_servers(urls, 5, 8)
