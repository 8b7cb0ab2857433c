"""Checks every estimator test runs (tests/test_*_estimators.py): the kernel against its loop
reference, and row order and padding changing nothing."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from tirjax import advantages
from tirjax.rollouts import Rollouts, to_numpy
from tirjax.testing.critic_values import with_values
from tirjax.testing.padding import pad, permute_rows
from tirjax.testing.reference import REFERENCES


def option_fields(opts) -> dict:
  """An options dataclass as the keyword arguments of its loop reference."""
  return {f: getattr(opts, f) for f in opts.__dataclass_fields__}


def check_reference(r: Rollouts, variants, keys=("steps", "rows", "tokens"), atol: float = 2e-5,
                    rtol: float = 1e-5) -> None:
  """Each (name, options) of `variants` against `REFERENCES[name]` on `r`: every output the
  reference gives among `keys` (within `atol`, `rtol`); tokens, rows and row rewards finite."""
  batch = to_numpy(r)
  for name, opts in variants:
    out = advantages.get(name)(r, opts)
    ref = REFERENCES[name](batch, **option_fields(opts))
    for key in keys:
      if key in ref:
        np.testing.assert_allclose(getattr(out, key), ref[key], atol=atol, rtol=rtol,
                                   err_msg=f"{name} {key} {opts}")
    for x in (out.tokens, out.rows, out.row_reward):
      assert np.all(np.isfinite(np.asarray(x))), name


def check_row_permutation(r: Rollouts, seed: int, names, field: str = "steps") -> None:
  """Reordering the rows reorders each estimator's `field` (and its row mask) alike."""
  perm = np.random.default_rng(seed).permutation(r.num_rows)
  moved = permute_rows(r, perm)
  for name in names:
    est = advantages.get(name)
    a, b = est(r), est(moved)
    np.testing.assert_allclose(getattr(b, field), np.asarray(getattr(a, field))[perm],
                               atol=1e-5, err_msg=name)
    np.testing.assert_array_equal(b.row_mask, np.asarray(a.row_mask)[perm], err_msg=name)


def check_padding(r: Rollouts, seed: int, names, field: str = "steps") -> None:
  """Padding rows, steps, calls, ground-truth slots and tokens change no estimator's `field`
  on the original rows, and the padding rows get nothing."""
  big, rows = pad(r, np.random.default_rng(seed), extra_rows=5, extra_steps=2, extra_calls=1,
                  extra_gt=1, extra_tokens=3)
  rest = np.ones(big.num_rows, bool)
  rest[rows] = False
  for name in names:
    est = advantages.get(name)
    a, b = np.asarray(getattr(est(r), field)), est(big)
    got = np.asarray(getattr(b, field))[rows]
    np.testing.assert_allclose(got[(slice(None),) + tuple(slice(0, n) for n in a.shape[1:])], a,
                               atol=1e-5, err_msg=name)
    np.testing.assert_allclose(np.asarray(b.rows)[rows], est(r).rows, atol=1e-5, err_msg=name)
    assert not np.any(np.asarray(b.tokens)[rest]) and not np.any(np.asarray(b.row_mask)[rest])


def with_needed_fields(est, r: Rollouts) -> Rollouts:
  """`r` with the optional fields `est` always reads. A batch without one is refused by name
  first (remax: `greedy_outcome`, "set rollout.greedy_baseline=True"); the stand-in filled
  then is R_out of each group's first valid row (the episode runner's own greedy rollout is
  tested in test_rollout_episodes). Likewise oracle's `turn_label` (refused naming it), whose
  stand-in labels a step right when it passed every format check (R_fm = 0.25; one label per
  tree node, as R_fm is); the trainer's own labels are tested in test_oracle. And igpo's
  `answer_logprob` (refused naming it), whose stand-in is log(0.5 + R_fm) of each step (one
  per tree node; the trainer's answer-probability pass is tested in test_answer_probe)."""
  if "greedy_outcome" in est.needs and r.greedy_outcome is None:
    try:
      est(r)
    except ValueError as e:
      if "greedy_baseline" not in str(e):
        raise
    else:
      raise AssertionError(f"{est.name}: a batch without greedy_outcome was not refused")
    group, valid = np.asarray(r.group_id), np.asarray(r.row_valid)
    outcome = np.asarray(r.outcome)
    first = {}
    for b in np.flatnonzero(valid):
      first.setdefault(int(group[b]), float(outcome[b]))
    filled = np.array([first.get(int(g), 0.0) for g in group], np.float32)
    r = r.replace(greedy_outcome=jnp.asarray(filled))
  if "values" in est.needs and r.values is None:  # ppo, turn_ppo: a stand-in critic's
    _refused(est, r, "values")
    r = with_values(r)
  if "turn_label" in est.needs and r.turn_label is None:
    _refused(est, r, "turn_label")
    right = np.asarray(r.format_reward) >= 0.25 - 1e-6  # every format check passed
    r = r.replace(turn_label=jnp.asarray(np.where(np.asarray(r.step_valid),
                                                  np.where(right, 1, -1), 0), jnp.int32))
  if "answer_logprob" in est.needs and r.answer_logprob is None:
    _refused(est, r, "answer_logprob")
    r = r.replace(answer_logprob=stand_in_answer_logprob(r))
  return r


def stand_in_answer_logprob(r: Rollouts) -> jnp.ndarray:
  """[B, T] log(0.5 + R_fm) on valid steps (in [log 0.25, log 0.75]; one per node), 0 on
  padding: a valid `answer_logprob` for tests that only need one."""
  fm = np.asarray(r.format_reward, np.float32)
  return jnp.asarray(np.where(np.asarray(r.step_valid), np.log(0.5 + fm), 0.0), jnp.float32)


def _refused(est, r: Rollouts, field: str) -> None:
  """`est` refuses `r`, which lacks `field`, with a message that names the field."""
  try:
    est(r)
  except ValueError as e:
    if field not in str(e):
      raise
  else:
    raise AssertionError(f"{est.name}: a batch without {field} was not refused")
