"""Reference chain task (tirjax.credit.task's docstring rules), with plain loops and dicts.

Independent of tirjax: the kind of each action is derived from the written rules, the value of
a policy by backward recursion over (progress, step) (tirjax propagates mass forward), and a
row's outcome by replaying its actions one at a time.
"""

from __future__ import annotations

from functools import lru_cache


def action_kind(cfg: dict, progress: int, action: int) -> str:
  """'answer', 'advance', 'fatal' or 'detour' (the rules of the task's docstring)."""
  D, A, fatal = cfg["num_stages"], cfg["num_actions"], cfg["fatal"]
  if action == 0:
    return "answer"
  if progress < D and action == progress + 1:
    return "advance"
  distractors = list(range(D + 1, A))
  crashing = {distractors[(progress + i) % len(distractors)] for i in range(fatal[progress])}
  return "fatal" if action in crashing else "detour"


def replay(cfg: dict, actions: list[int]) -> dict:
  """Outcome, answered, per-step format rewards, states and advances of one action sequence.

  The sequence must be a whole episode: it ends at its first terminal action or at T_max.
  """
  progress, fm, states, solves = 0, [], [], []
  for t, a in enumerate(actions):
    states.append(progress * cfg["max_steps"] + t)
    kind = action_kind(cfg, progress, a)
    fm.append(cfg["fatal_format"] if kind == "fatal" else cfg["ok_format"])
    solves.append(kind == "advance")
    if kind in ("answer", "fatal"):
      assert t == len(actions) - 1, "a terminal action must end the episode"
      if kind == "fatal":
        return dict(outcome=-1.0, answered=False, format_reward=fm, states=states, solves=solves)
      outcome = 1.0 if progress == cfg["num_stages"] else cfg["early_answer"]
      return dict(outcome=outcome, answered=True, format_reward=fm, states=states, solves=solves)
    if kind == "advance":
      progress += 1
  assert len(actions) == cfg["max_steps"], "an unfinished episode must run T_max steps"
  return dict(outcome=-1.0, answered=False, format_reward=fm, states=states, solves=solves)


def value(cfg: dict, probs) -> dict:
  """P(success) and E[R_out] of the policy probs[state][action] by backward recursion."""
  D, T, A = cfg["num_stages"], cfg["max_steps"], cfg["num_actions"]

  @lru_cache(maxsize=None)
  def go(k: int, t: int) -> tuple[float, float]:  # (P(success), E[R_out]) from (k, t)
    if t == T:
      return 0.0, -1.0
    success = outcome = 0.0
    for a in range(A):
      p = float(probs[k * T + t][a])
      if p == 0.0:
        continue
      kind = action_kind(cfg, k, a)
      if kind == "answer":
        win = k == D
        success += p * win
        outcome += p * (1.0 if win else cfg["early_answer"])
      elif kind == "fatal":
        outcome -= p
      else:
        s, o = go(k + (kind == "advance"), t + 1)
        success += p * s
        outcome += p * o
    return success, outcome

  s, o = go(0, 0)
  return dict(success=s, mean_outcome=o)
