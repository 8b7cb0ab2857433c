"""Runs the peer's HGPO step advantages (github CazeroZ/hgpo, `hgpo/core_hgpo.py`) on the
inputs that `hgpo_peer` writes, under the vLLM environment's Python (numpy and torch, no jax):

    .venv-vllm/bin/python experiments/studies/hgpo_peer_runner.py SOURCE INPUT OUTPUT

SOURCE is the peer file, read from the fetched snapshot and exec'd as it is (never copied into
this repository). Its only project import, `verl.DataProto`, is a type it never calls here, so a
stub module stands in for it; its `breakpoint()` calls are made no-ops and its prints silenced.
"""

import contextlib
import io
import json
import sys
import types

import numpy as np
import torch


def load_peer(path: str):
  verl = types.ModuleType("verl")
  verl.DataProto = object  # only an annotation in the functions used
  sys.modules["verl"] = verl
  sys.breakpointhook = lambda *a, **k: None
  module = types.ModuleType("core_hgpo")
  with open(path, encoding="utf-8") as f:
    exec(compile(f.read(), path, "exec"), module.__dict__)  # noqa: S102  (the peer's own code)
  return module


def main(source: str, inp: str, out: str) -> None:
  peer = load_peer(source)
  with open(inp, encoding="utf-8") as f:
    cases = json.load(f)
  results = []
  for case in cases:
    steps = case["steps"]  # one entry per valid step: group, row, observation, return
    obs = np.empty(len(steps), dtype=object)
    obs[:] = [tuple(s["obs"]) for s in steps]
    try:
      with contextlib.redirect_stdout(io.StringIO()):
        adv, _ = peer.compute_hgpo_outcome_advantage(
            step_rewards=torch.tensor([s["ret"] for s in steps], dtype=torch.float32),
            response_mask=torch.ones(len(steps), 1),
            anchor_obs=obs,
            index=np.array([s["group"] for s in steps]),
            traj_index=np.array([s["row"] for s in steps]),
            history_length=case["history"], mode=case["mode"])
      results.append(adv[:, 0].tolist())
    except Exception as e:  # noqa: BLE001  (the peer's failure is a result here)
      results.append({"error": f"{type(e).__name__}: {e}"})
  with open(out, "w", encoding="utf-8") as f:
    json.dump(results, f)


if __name__ == "__main__":
  main(*sys.argv[1:4])
