"""`stages.every`, the one test of "every N steps" (evaluation, logging, checkpoints)."""

from tirjax.trainer.stages import every


def test_every_counts_the_steps_done_and_zero_is_never():
  assert [d for d in range(1, 13) if every(d, 4)] == [4, 8, 12]
  assert all(every(d, 1) for d in range(1, 5))
  assert not any(every(d, 0) for d in range(0, 10))
