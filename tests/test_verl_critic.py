"""`ppo`'s GAE and the clipped value loss against verl's own functions (issue 53).

benchmarks/results/verl_critic.json holds verl's `compute_gae_advantage_return` and
`compute_value_loss` (commit b178a3c, exec'd alone from its source with torch on the CPU the
file names; `python -m experiments.studies.verl_critic`) on 120 random multi-turn batches.
Here each batch becomes a `Rollouts` (a prompt token, then the response: runs of loss tokens
are steps, the gaps tool responses) and tirjax recomputes. Where the conventions agree there
are 0 mismatches; the conventions that differ, declared:

* verl writes the carried advantage on tokens outside its response mask (tool responses,
  padding); tirjax writes 0 there (out of the loss either way). Only loss tokens compare.
* whitening: verl (x − mean)·rsqrt(var + 1e-8), tirjax spec §3's (x − mean)/(std + 1e-6)
  (both ddof 1): the whitened advantages agree within 1e-4, the raw ones (verl's returns −
  values) to float32 precision.
* "seq-mean-token-sum-norm": verl divides the summed loss by the constant only, tirjax by the
  constant and the rows R that carry tokens (its aggregation module's definition): tirjax's
  value times R is verl's.
* verl has no turn-level GAE: `turn_ppo` has no peer here (its loop reference only).
"""

import functools
import json
import os
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tirjax import segments
from tirjax.advantages import critic
from tirjax.loss.value import value_loss
from tirjax.rollouts import empty_arrays, from_numpy

RESULT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "results",
                      "verl_critic.json")
MODES = {"token-mean": "token_mean", "seq-mean-token-mean": "seq_mean_token_mean",
         "seq-mean-token-sum": "seq_mean_token_sum",
         "seq-mean-token-sum-norm": "seq_mean_token_sum_norm"}


# Every batch padded to one shape (padding rows, padding tokens), so that each kernel compiles
# once; γ and λ enter as traced values.
B_MAX, L_MAX, T_MAX = 8, 16, 8


def load():
  with open(RESULT) as f:
    return json.load(f)


def padded(x, fill=0):
  x = np.asarray(x)
  out = np.full((B_MAX, L_MAX), fill, x.dtype)
  out[:x.shape[0], :x.shape[1]] = x
  return out


def to_rollouts(item: dict):
  """The batch as `Rollouts` padded to [B_MAX, 1 + L_MAX]: position 0 a prompt token,
  positions 1.. the response; and the response mask padded to [B_MAX, L_MAX]."""
  mask = np.asarray(item["response_mask"], bool)
  B, L = mask.shape
  runs = [np.flatnonzero(np.diff(np.concatenate([[0], m.astype(int)])) == 1) for m in mask]
  T = T_MAX
  assert max(len(r) for r in runs) <= T and B <= B_MAX and L <= L_MAX
  a = empty_arrays(B_MAX, T, 1, 1, L_MAX + 1)
  a["row_valid"][:B] = True
  a["outcome"][:B] = item["outcome"]
  a["tokens"][:B, :L + 1] = 1
  a["token_valid"][:B, :L + 1] = True
  a["loss_mask"][:B, 1:L + 1] = mask
  step = np.cumsum(np.diff(np.concatenate([np.zeros((B, 1), int), mask.astype(int)], 1),
                           axis=1) == 1, axis=1) - 1
  a["token_step"][:B, 1:L + 1] = np.where(mask, step, -1)
  for b in range(B):
    n = len(runs[b])
    a["num_steps"][b] = n
    a["step_valid"][b, :n] = True
    a["node_id"][b, :n] = b * T + np.arange(n)
  a["values"] = np.zeros((B_MAX, L_MAX + 1), np.float32)
  a["values"][:B, 1:L + 1] = item["values"]
  return from_numpy(a), padded(mask, False)


@jax.jit
def tirjax_gae(r, gamma, lam):
  """(raw A, G, whitened A) [B, L] of `ppo` (rows independent: "own" is "mean")."""
  opts = types.SimpleNamespace(gamma=gamma, lam=lam, shared_prefix="own")
  adv, returns, _, live = critic.token_gae(r, opts)
  return adv, returns, segments.whiten(adv, live, segments.ZScore())


@functools.partial(jax.jit, static_argnames=("clip", "mode"))
def tirjax_value_loss(vpreds, values, returns, mask, clip, mode):
  norm = 1.0 if mode == "seq_mean_token_sum_norm" else None
  out = value_loss(vpreds, values, returns, mask, clip, mode, norm)
  return out.loss.sum, out.loss.den, out.clipfrac.value


def mismatches(got, want, atol, rtol=1e-5) -> int:
  return int(np.sum(~np.isclose(got, want, atol=atol, rtol=rtol)))


def test_the_result_names_verl_and_the_cpu():
  result = load()
  assert result["verl_commit"].startswith("b178a3c") and result["machine"]["cpu"]
  assert len(result["batches"]) >= 100


def test_gae_matches_verl_on_loss_tokens():
  compared = {"raw": 0, "returns": 0, "whitened": 0}
  bad = dict.fromkeys(compared, 0)
  for item in load()["batches"]:
    r, mask = to_rollouts(item)
    values, returns = padded(item["values"]), padded(item["returns"])
    raw, ret, white = (np.asarray(x)[:, 1:] for x in tirjax_gae(r, item["gamma"], item["lam"]))
    for key, got, want, atol in (
        ("raw", raw, returns - values, 1e-5), ("returns", ret, returns, 1e-5),
        ("whitened", white, padded(item["advantages"]), 1e-4)):
      compared[key] += int(mask.sum())
      bad[key] += mismatches(got[mask], want[mask], atol)
  assert bad == dict.fromkeys(compared, 0), (bad, compared)
  assert min(compared.values()) > 1000


@pytest.mark.parametrize("verl_mode", list(MODES))
def test_value_loss_matches_verl(verl_mode):
  bad, n = 0, 0
  mode = MODES[verl_mode]
  for item in load()["batches"]:
    L = np.shape(item["response_mask"])[1]
    total, den, clipfrac = tirjax_value_loss(
        *(jnp.asarray(padded(item[k]), jnp.float32) for k in ("vpreds", "values", "returns")),
        jnp.asarray(padded(item["response_mask"], 0) > 0), item["cliprange_value"], mode)
    got = float(total) / float(den)
    if mode == "seq_mean_token_sum_norm":
      got = float(total) / L  # declared: verl divides by the constant (its default L) only
    want = item["value_loss"][verl_mode]
    n += 1
    bad += mismatches(got, want["vf_loss"], 1e-5)
    bad += mismatches(float(clipfrac), want["vf_clipfrac"], 1e-6)
  assert (bad, n >= 100) == (0, True)
