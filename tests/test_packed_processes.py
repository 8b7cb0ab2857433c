"""The packed update with 2 processes (issue 38, spec §9): 2 processes × 4 simulated CPU
devices (gloo) against 1 process × 8, each running `tirjax.testing.packed_processes`.

Each process packs its own rows (its half of the batch: trees, independent and irregular
groups), the shapes are agreed between the processes, and each mini-batch holds both
processes' groups. What must hold: the packed updates' losses and gradients equal the padded
ones of the one-process run (1e-5 relative), the packed KL reference pass equals the one-process one
on every generated token, and the packed SFT step (each process packing its share of the
demonstrations) equals the padded one.
"""

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from tirjax.testing.subprocess_env import multiprocess_env

pytestmark = [pytest.mark.xdist_group("multiprocess"), pytest.mark.slow,
              pytest.mark.cores(2)]  # 2 processes
TOL = 1e-5


def _port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _run(out, processes: int):
  # LLVM optimisation level 0, as conftest sets in-process: these runs compile far more than
  # they compute (the default level takes about twice as long).
  env = multiprocess_env(8 // processes, "--xla_backend_optimization_level=0")
  command = [sys.executable, "-m", "tirjax.testing.packed_processes", f"--out={out}"]
  if processes > 1:
    port = _port()
    command += [f"--num_processes={processes}", f"--coordinator=localhost:{port}"]
  procs = [subprocess.Popen(command + ([f"--process_id={p}"] if processes > 1 else []),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for p in range(processes)]
  logs = [proc.communicate(timeout=900)[0] for proc in procs]
  assert [proc.returncode for proc in procs] == [0] * processes, "\n".join(
      log[-3000:] for log in logs)
  return dict(np.load(os.path.join(out, "result.npz")))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
  root = tmp_path_factory.mktemp("packed_processes")
  return {n: _run(root / f"p{n}", n) for n in (1, 2)}


def _grads(result, name):
  return [result[k] for k in sorted((k for k in result if k.startswith(f"{name}/grad")),
                                    key=lambda k: int(k.split("grad")[1]))]


@pytest.mark.parametrize("processes", [1, 2])
def test_packed_update_equals_the_padded_one_on_every_process_count(results, processes):
  want, got = results[1], results[processes]
  np.testing.assert_allclose(got["packed/losses"], want["padded/losses"], rtol=TOL)
  for a, b in zip(_grads(got, "packed"), _grads(want, "padded"), strict=True):
    np.testing.assert_allclose(a, b, rtol=TOL, atol=TOL * (float(np.max(np.abs(b))) or 1.0))
  assert np.linalg.norm(np.concatenate([g.ravel() for g in _grads(want, "padded")])) > 0.01


def test_packed_reference_pass_with_two_processes(results):
  one, two = results[1], results[2]
  generated = one["loss_mask"].astype(bool)
  np.testing.assert_array_equal(two["loss_mask"], one["loss_mask"])
  np.testing.assert_allclose(two["ref_logprobs"][generated], one["ref_logprobs"][generated],
                             rtol=TOL, atol=TOL)
  assert np.all(two["ref_logprobs"][~generated] == 0) and np.all(
      one["ref_logprobs"][generated] != 0)


@pytest.mark.parametrize("processes", [1, 2])
def test_packed_sft_step_equals_the_padded_one_on_every_process_count(results, processes):
  want, got = results[1], results[processes]
  np.testing.assert_allclose(got["sft_packed/loss"], want["sft_padded/loss"], rtol=TOL)
  for a, b in zip(_grads(got, "sft_packed"), _grads(want, "sft_padded"), strict=True):
    np.testing.assert_allclose(a, b, rtol=TOL, atol=TOL * float(np.max(np.abs(b))))
  assert np.linalg.norm(np.concatenate([g.ravel() for g in _grads(want, "sft_padded")])) > 0.01
  assert got["sft_packed/forwarded"] < want["sft_padded/forwarded"]
