"""Credit fidelity (spec §4.5) in plain loops, from the spec's words: the reference of
`tirjax.metrics.credit`."""

from __future__ import annotations

from typing import Optional, Sequence


def turn_advantages(token_adv, token_step, loss_mask, max_steps: int) -> list[list[float]]:
  """Per row and step: the mean of the advantages of the step's loss tokens (0 if none)."""
  out = []
  for adv_row, step_row, mask_row in zip(token_adv, token_step, loss_mask):
    sums, counts = [0.0] * max_steps, [0] * max_steps
    for a, t, m in zip(adv_row, step_row, mask_row):
      if m and t >= 0:
        sums[t] += float(a)
        counts[t] += 1
    out.append([s / c if c else 0.0 for s, c in zip(sums, counts)])
  return out


def measures(query: Sequence[int], adv: Sequence[float], right: Sequence[bool],
             outcome: Sequence[float]) -> dict[str, Optional[float]]:
  """AUC (every right-wrong pair, ties ½; also over pairs of one query, and of one all-fail
  query), wrong turns with A < 0, right turns of failed
  episodes with A < 0, wrong turns of successful episodes with A > 0, turns with A = 0, and
  turns with A = 0 among the queries none of whose turns is in a successful episode."""
  n = len(adv)
  succeeded = {query[i] for i in range(n) if outcome[i] > 0}

  def pair_auc(same_query: bool, only_all_fail: bool):
    pairs = wins = 0.0
    for i in range(n):
      for j in range(n):
        if not (right[i] and not right[j]):
          continue
        if same_query and query[i] != query[j]:
          continue
        if only_all_fail and (query[i] in succeeded or query[j] in succeeded):
          continue
        pairs += 1
        wins += 1.0 if adv[i] > adv[j] else 0.5 if adv[i] == adv[j] else 0.0
    return wins / pairs if pairs else None

  def share(hit, among):
    picked = [hit(i) for i in range(n) if among(i)]
    return sum(picked) / len(picked) if picked else None

  return {"auc": pair_auc(False, False), "auc_query": pair_auc(True, False),
          "auc_all_fail": pair_auc(True, True),
          "wrong_negative": share(lambda i: adv[i] < 0, lambda i: not right[i]),
          "collateral_blame": share(lambda i: adv[i] < 0,
                                    lambda i: right[i] and outcome[i] < 0),
          "free_credit": share(lambda i: adv[i] > 0, lambda i: not right[i] and outcome[i] > 0),
          "no_signal": share(lambda i: adv[i] == 0, lambda i: True),
          "no_signal_all_fail": share(lambda i: adv[i] == 0,
                                      lambda i: query[i] not in succeeded)}
