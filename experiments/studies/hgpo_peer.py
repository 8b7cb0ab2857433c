"""HGPO (tirjax/advantages/hgpo.py) against its peer code on random batches (issue 54).

    python -m experiments.studies.hgpo_peer --json=benchmarks/results/hgpo_peer.json

The peer is github CazeroZ/hgpo, `hgpo/core_hgpo.py` (commit `PEER_COMMIT`, "anonymous code
for ICLR submission"), fetched as a snapshot; `hgpo_peer_runner.py` execs it under
`--peer_python` (numpy and torch) on the step lists written here, so nothing of it enters this
repository. Random rollout trees (`synthetic.tree_rollouts`) get observations drawn from a
small alphabet, so that steps with different histories often see the same observation; batches
where some step's observation is unique in its group are redrawn, because the peer's branch for
such steps reads a stale loop variable (see CONVENTIONS). The recorded result holds each
batch's arrays and step list (`batches`), and per (batch, history, mode) the peer's step
advantages and tirjax's (`cases`); tests/test_hgpo_peer.py recomputes
tirjax on the recorded arrays and compares with the recorded peer values.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from absl import flags
import numpy as np

from tirjax import advantages, cli, segments
from tirjax.advantages.hgpo import HGPOOptions
from tirjax.reporting import benchmark
from tirjax.rollouts import from_numpy, to_numpy
from tirjax.testing import synthetic
from tirjax.testing.reference.hgpo import observations

flags.DEFINE_string("json", "benchmarks/results/hgpo_peer.json", "Where the result goes.")
flags.DEFINE_string("peer_source", None, "The peer's core_hgpo.py (default: read from the "
                    "fetched snapshot at --peer_git).")
flags.DEFINE_string("peer_git", "/work/.mirror/CazeroZ+hgpo/repo", "The peer's git directory.")
flags.DEFINE_string("peer_python", "/work/main/.venv-vllm/bin/python",
                    "A Python with numpy and torch.")
flags.DEFINE_integer("batches", 6, "Random batches per (history, mode).")
flags.DEFINE_integer("unique_batches", 4, "Batches with a unique observation, run to record the "
                     "peer's behaviour there (not compared).")
FLAGS = flags.FLAGS

PEER_REPO = "CazeroZ/hgpo"
PEER_COMMIT = "aa649272e79506e295ba6dfb43dd06bbaee22e97"
PEER_PATH = "hgpo/core_hgpo.py"
MODES = {"mean_norm": segments.ZScore(scale="none"), "mean_std_norm": segments.ZScore(ddof=0)}
HISTORIES = (1, 2, 3)
GAMMA = 0.95
TOLERANCE = 1e-5
CONVENTIONS = {
    "observation": "tirjax: the tokens outside the loss shown before the step (prompt for the "
                   "first); the peer: the environment's anchor_obs. Fed the same tuples here.",
    "returns": "both: gamma^(T - t) R_out per step (the peer's compute_step_discounted_returns "
               "with the outcome as the only reward).",
    "mean_norm": "peer 'mean_norm' = tirjax zscore scale='none'; 'mean_std_norm' = ddof=0 "
                 "(np.std), eps 1e-6 added to the std in both.",
    "zero_levels": "the peer leaves out of the weighted average every level whose advantage is "
                   "exactly 0; tirjax does so only with drop_zero_levels=True (compared so); "
                   "mismatches_keeping_zero_levels counts the steps where it matters.",
    "episode_term": "the peer's trainer uses the step term alone: tirjax episode_weight=0.",
    "weights": "both: w_k = (k + 1)^alpha, alpha = 1 (the peer hard-codes alpha = 1 and ignores "
               "its weight_type option).",
    "unique_observation_bug": "the peer's branch for steps whose observation is unique in the "
                              "group (the 'alone' cluster) reads `idx` left over from an earlier "
                              "loop: it zeroes the advantage of an unrelated, already computed "
                              "step, or raises NameError/IndexError when none is left over. "
                              "tirjax gives such steps 0 and leaves the others alone. Batches "
                              "with such steps are redrawn here (not compared).",
}


def peer_steps(batch: dict) -> list[dict]:
  """The valid steps in the peer's layout (trajectory by trajectory, steps in order)."""
  out = []
  for b in np.flatnonzero(batch["row_valid"]):
    obs = observations(batch, int(b))
    n, outcome = int(batch["num_steps"][b]), float(batch["outcome"][b])
    for t in range(n):
      out.append(dict(group=int(batch["group_id"][b]), row=int(b), step=t,
                      obs=list(obs.get(t, ())), ret=GAMMA ** (n - 1 - t) * outcome))
  return out


def no_unique_observation(steps: list[dict]) -> bool:
  seen: dict = {}
  for s in steps:
    key = (s["group"], tuple(s["obs"]))
    seen[key] = seen.get(key, 0) + 1
  return min(seen.values()) >= 2


def draw_batch(seed: int):
  """A random tree batch whose tool responses are drawn from 2 strings of 2 tokens."""
  rng = np.random.default_rng(seed)
  sizes = list(rng.integers(2, 6, 4))
  r = synthetic.tree_rollouts(rng, sizes, branching=2, max_depth=4, finish_prob=0.3,
                             num_rows=24, max_steps=4)  # one shape: one compile per option
  a = {k: np.array(v) for k, v in to_numpy(r).items()}
  B, L = a["tokens"].shape
  for b in range(B):
    last, symbol = -1, {}
    for i in range(L):
      if a["loss_mask"][b, i]:
        last = int(a["token_step"][b, i])
      elif a["token_valid"][b, i] and last >= 0:
        node = int(a["node_id"][b, last])  # rows that share a node share its response
        symbol.setdefault(node, int(np.random.default_rng([seed, node]).integers(0, 2)))
        a["tokens"][b, i] = 1 + symbol[node]
  return from_numpy(a)


def run_peer(cases: list[dict]) -> list[list[float]]:
  with tempfile.TemporaryDirectory() as tmp:
    source = FLAGS.peer_source
    if source is None:
      source = os.path.join(tmp, "core_hgpo.py")
      with open(source, "w", encoding="utf-8") as f:
        f.write(subprocess.run(["git", "-C", FLAGS.peer_git, "show",
                                f"{PEER_COMMIT}:{PEER_PATH}"], check=True, capture_output=True,
                               text=True).stdout)
    inp, out = os.path.join(tmp, "in.json"), os.path.join(tmp, "out.json")
    with open(inp, "w", encoding="utf-8") as f:
      json.dump(cases, f)
    runner = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hgpo_peer_runner.py")
    subprocess.run([FLAGS.peer_python, runner, source, inp, out], check=True)
    with open(out, encoding="utf-8") as f:
      return json.load(f)


def tirjax_steps(r, opts: HGPOOptions, steps: list[dict]) -> list[float]:
  adv = np.asarray(advantages.get("hgpo")(r, opts).steps)
  return [float(adv[s["row"], s["step"]]) for s in steps]


def unique_case(case: dict, theirs) -> dict:
  """What the peer did on a batch with a step whose observation is unique in its group."""
  steps = case["steps"]
  ours = tirjax_steps(case["r"], options(case["history"], case["mode"]), steps)
  counts: dict = {}
  for s in steps:
    counts[(s["group"], tuple(s["obs"]))] = counts.get((s["group"], tuple(s["obs"])), 0) + 1
  alone = [i for i, s in enumerate(steps) if counts[(s["group"], tuple(s["obs"]))] == 1]
  rec = dict(seed=case["seed"], history=case["history"], mode=case["mode"], steps=len(steps),
             unique_steps=len(alone))
  if isinstance(theirs, dict):
    return {**rec, "peer_error": theirs["error"]}
  differ = [i for i in range(len(steps)) if abs(ours[i] - theirs[i]) > TOLERANCE]
  return {**rec, "differing_steps": len(differ),
          "differing_steps_with_a_shared_observation": len(set(differ) - set(alone)),
          "peer_zero_where_tirjax_not": sum(1 for i in differ if theirs[i] == 0)}


def options(history: int, mode: str, drop_zero_levels: bool = True) -> HGPOOptions:
  return HGPOOptions(gamma=GAMMA, history=history, alpha=1.0, zscore=MODES[mode],
                     episode_weight=0.0, drop_zero_levels=drop_zero_levels)


def main(argv):
  del argv
  out = dict(command="python -m experiments.studies.hgpo_peer " + " ".join(sys.argv[1:]),
             machine=benchmark.machine(), peer=dict(repo=PEER_REPO, commit=PEER_COMMIT,
                                                    path=PEER_PATH),
             gamma=GAMMA, tolerance=TOLERANCE, conventions=CONVENTIONS, cases=[])
  seed, batches, unique = 0, [], []
  while len(batches) < FLAGS.batches or len(unique) < FLAGS.unique_batches:
    r = draw_batch(seed)
    steps = peer_steps(to_numpy(r))
    (batches if no_unique_observation(steps) else unique).append((seed, r, steps))
    seed += 1
  batches, unique = batches[:FLAGS.batches], unique[:FLAGS.unique_batches]
  cases = [dict(seed=s, history=h, mode=m, steps=steps, r=r)
           for h in HISTORIES for m in MODES for s, r, steps in batches]
  odd = [dict(seed=s, history=2, mode="mean_norm", steps=steps, r=r) for s, r, steps in unique]
  peer = run_peer([{k: c[k] for k in ("history", "mode", "steps")} for c in cases + odd])
  peer, peer_odd = peer[:len(cases)], peer[len(cases):]
  out["unique_observation_cases"] = [unique_case(c, theirs) for c, theirs in zip(odd, peer_odd)]
  out["batches"] = {str(s): dict(arrays={k: v.tolist() for k, v in to_numpy(r).items()},
                                 steps=steps) for s, r, steps in batches}
  for case, theirs in zip(cases, peer):
    r, steps = case.pop("r"), case.pop("steps")
    ours = tirjax_steps(r, options(case["history"], case["mode"]), steps)
    keep = tirjax_steps(r, options(case["history"], case["mode"], False), steps)
    diff = np.abs(np.array(ours) - np.array(theirs))
    case.update(peer=theirs,
                tirjax=ours, max_abs_diff=float(diff.max(initial=0.0)),
                mismatches=int(np.sum(diff > TOLERANCE)),
                mismatches_keeping_zero_levels=int(np.sum(
                    np.abs(np.array(keep) - np.array(theirs)) > TOLERANCE)),
                nonzero_steps=int(np.sum(np.abs(np.array(theirs)) > 0)))
    out["cases"].append(case)
    print(f"seed {case['seed']} K={case['history']} {case['mode']:13s} steps {len(steps):3d} "
          f"nonzero {case['nonzero_steps']:3d} max|diff| {case['max_abs_diff']:.2e} "
          f"mismatches {case['mismatches']} (keeping zero levels: "
          f"{case['mismatches_keeping_zero_levels']})", flush=True)
  out["summary"] = dict(cases=len(out["cases"]),
                        steps=sum(len(c["peer"]) for c in out["cases"]),
                        mismatches=sum(c["mismatches"] for c in out["cases"]),
                        max_abs_diff=max(c["max_abs_diff"] for c in out["cases"]),
                        mismatches_keeping_zero_levels=sum(
                            c["mismatches_keeping_zero_levels"] for c in out["cases"]))
  print(json.dumps(out["summary"]))
  print(json.dumps(out["unique_observation_cases"]))
  benchmark.write_result(FLAGS.json, out)


if __name__ == "__main__":
  cli.run(main)
