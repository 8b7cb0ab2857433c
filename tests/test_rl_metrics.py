"""The RL step's learning-signal shares (issue 26): groups with mixed outcomes and rows with a
non-zero advantage, against a loop over the batch's groups and rows."""

import numpy as np
from hypothesis import given, strategies as st

from tirjax import advantages
from tirjax.trainer.rl_metrics import signal_shares
from tirjax.testing import synthetic


def shares_by_loop(r, adv):
  valid = np.asarray(r.row_valid)
  groups = {}
  for b in np.flatnonzero(valid):
    groups.setdefault(int(r.group_id[b]), set()).add(float(r.outcome[b]))
  mixed = [len(outcomes) > 1 for outcomes in groups.values()]
  pushed = []
  for b in np.flatnonzero(valid):
    steps = [float(adv.steps[b, t]) for t in range(r.max_steps) if r.step_valid[b, t]]
    pushed.append(bool(adv.row_mask[b]) and any(a != 0 for a in steps))
  return (float(np.mean(mixed)) if mixed else 0.0, float(np.mean(pushed)) if pushed else 0.0)


@given(st.integers(0, 2**31 - 1), st.lists(st.integers(1, 6), min_size=1, max_size=6),
       st.sampled_from(["grpo", "dapo", "portool"]), st.integers(0, 4))
def test_signal_shares_match_a_loop(seed, sizes, name, padding):
  rng = np.random.default_rng(seed)
  make = synthetic.tree_rollouts if name == "portool" else synthetic.independent_rollouts
  r = make(rng, sizes, num_rows=sum(sizes) + padding)
  estimator = advantages.get(name)
  adv = estimator(r, estimator.make_options({}))
  got = signal_shares(r, adv)
  mixed, pushed = shares_by_loop(r, adv)
  np.testing.assert_allclose(got["groups/mixed_share"], mixed)
  np.testing.assert_allclose(got["rows/nonzero_advantage_share"], pushed)


def test_all_equal_groups_carry_no_signal():
  """Every group all wrong: no group is mixed and GRPO pushes no row."""
  r = synthetic.independent_rollouts(np.random.default_rng(0), [4, 4],
                                     outcome_probs=(0.0, 0.0, 1.0))
  adv = advantages.get("grpo")(r, advantages.get("grpo").make_options({}))
  assert signal_shares(r, adv) == {"groups/mixed_share": 0.0,
                                   "rows/nonzero_advantage_share": 0.0}
