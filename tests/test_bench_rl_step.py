"""`tirjax.reporting.rl_step.limits`: what bounds the RL-step targets, from measured phases."""

import pytest

from tirjax.reporting import rl_step


def test_limits_from_the_phases():
  phases = dict(advantages=0.0, handover=0.5, reference=1.0, update=3.5)
  old = {f"time/{k}_s": v for k, v in phases.items()} | {"time/rollout_s": 10.0,
                                                          "time/step_s": 15.0}
  new = {f"time/{k}_s": v for k, v in phases.items()} | {
      "time/rollout_s": 4.0, "time/step_s": 9.0, "time/sampler_s": 4.0, "time/prefill_s": 1.0,
      "time/decode_s": 2.5, "tokens/decode": 2000.0}
  out = rl_step.limits({"variants": {"re-prefill": old, "prefix cache": new},
                              "raw_decode_tokens_per_s": 1000.0})
  assert out["step_speedup_bound"] == pytest.approx(15.0 / 5.0)  # a free rollout: 3x at most
  assert out["decode_efficiency"] == pytest.approx(0.8)
  assert out["sampler_time_shares"] == pytest.approx(
      {"prefill": 0.25, "decode": 0.625, "other": 0.125})
  assert sum(out["cached_step_shares"].values()) == pytest.approx(1.0)
