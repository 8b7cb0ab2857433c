"""Random chain tasks (a hypothesis strategy) and random tabular policies over them, for the
credit-assignment tests."""

import numpy as np
from hypothesis import strategies as st

from tirjax.credit.task import ChainTask


@st.composite
def tasks(draw):
  """A small `ChainTask`: 1-3 stages, a few more actions, any fatal counts and rewards."""
  D = draw(st.integers(1, 3))
  A = draw(st.integers(D + 2, D + 5))
  M = A - 1 - D
  fatal = tuple(draw(st.integers(0, M)) for _ in range(D + 1))
  return ChainTask(num_stages=D, num_actions=A, fatal=fatal,
                   max_steps=draw(st.integers(D + 1, D + 3)),
                   early_answer=draw(st.sampled_from([0.0, -1.0])),
                   ok_format=draw(st.sampled_from([0.25, 0.1])),
                   fatal_format=draw(st.sampled_from([-0.25, 0.0])))


def random_policy(rng, task, concentration=0.5):
  """Action probabilities per state of `task`, each row Dirichlet(`concentration`)."""
  return rng.dirichlet(np.full(task.num_actions, concentration), task.num_states)
