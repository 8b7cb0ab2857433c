"""Reference of the oracle positive control (spec §4.4), written from the spec's text with loops.

"A right turn gets +1 and a wrong turn −1, whatever the row's outcome and its group's; a step
without a label (or a padding step) gets 0; each generated token of a step takes its step's
value. A row's value is the mean of its valid steps' values (0 without steps)."
"""

from __future__ import annotations

import numpy as np


def oracle(batch: dict) -> dict:
  """`steps` [B, T], `rows` [B], `tokens` [B, L] from `batch["turn_label"]`."""
  label = batch["turn_label"]
  B, T = batch["step_valid"].shape
  L = batch["loss_mask"].shape[1]
  steps, rows, tokens = np.zeros((B, T)), np.zeros(B), np.zeros((B, L))
  for b in range(B):
    if not batch["row_valid"][b]:
      continue
    valid = [t for t in range(T) if batch["step_valid"][b, t]]
    for t in valid:
      if label[b, t] == 1:
        steps[b, t] = 1.0
      elif label[b, t] == -1:
        steps[b, t] = -1.0
    if valid:
      rows[b] = sum(steps[b, t] for t in valid) / len(valid)
    for i in range(L):
      if batch["loss_mask"][b, i]:
        tokens[b, i] = steps[b, batch["token_step"][b, i]]
  return dict(steps=steps, rows=rows, tokens=tokens)
