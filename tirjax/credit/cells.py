"""Bench cells: an estimator from the registry, its options, the rollout kind and the loss.

A cell is named by a label `estimator[/key=value,key=value...]`, as the trainer's run
directories are (e.g. "portool/omega1=0", "portool/shared_step_trj=own"). Keys are the
estimator's options, except `rollouts`, which picks the rollout kind ("tree", the default,
or "independent"), and `loss.<field>`, which overrides a `LossOptions` field of the
estimator's default loss (e.g. "grpo/loss.aggregation=token_mean"). Values are read as JSON
where they parse (0, 0.5, true) and as strings otherwise.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tirjax import advantages
from tirjax.advantages.labels import split_label
from tirjax.credit.chain_rollouts import ChainRolloutOptions
from tirjax.loss import LossOptions


@dataclasses.dataclass(frozen=True)
class Cell:
  label: str
  estimator: str
  options: tuple[tuple[str, Any], ...]  # estimator option overrides, sorted by key
  rollouts: ChainRolloutOptions
  loss: LossOptions

  def estimator_options(self):
    return advantages.get(self.estimator).make_options(dict(self.options))


def default_loss(estimator: str, max_tokens: int) -> LossOptions:
  """The loss each estimator is paired with (spec §4.3, §5).

  DAPO: clip-higher ε_high = 0.28 with the token-mean loss; Dr. GRPO: the sum over tokens
  divided by a fixed constant (the longest possible row, `max_tokens`); REINFORCE++ and its
  baseline variant, and verl's optimal token baselines: the token mean (their token-level
  objectives, as their configs); all others: GRPO's and PORTool's sequence-mean of
  token-means with ε = 0.2.
  """
  if estimator == "dapo":
    return LossOptions(clip_high=0.28, aggregation="token_mean")
  if estimator in ("reinforce_plus_plus", "reinforce_plus_plus_baseline",
                   "optimal_token_baseline", "tir_optimal_token_baseline"):
    return LossOptions(aggregation="token_mean")
  if estimator == "dr_grpo":
    return LossOptions(aggregation="seq_mean_token_sum_norm", norm_constant=float(max_tokens))
  return LossOptions()


def parse_cell(label: str, rollouts: ChainRolloutOptions, max_tokens: int) -> Cell:
  """The cell named `label`; unknown estimators and options fail by name.

  Args:
    label: `estimator[/key=value,...]`.
    rollouts: rollout options; a `rollouts=<kind>` item replaces their kind.
    max_tokens: the longest row in tokens (Dr. GRPO's loss constant).
  """
  name, overrides = split_label(label)
  kind = overrides.pop("rollouts", rollouts.kind)
  rollouts = dataclasses.replace(rollouts, kind=kind)
  loss_keys = {k for k in overrides if k.startswith("loss.")}
  loss = default_loss(name, max_tokens)
  fields = {f.name for f in dataclasses.fields(LossOptions)}
  for key in sorted(loss_keys):
    if key[5:] not in fields:
      raise ValueError(f"cell '{label}': unknown loss option '{key[5:]}'; valid: {sorted(fields)}")
  loss_overrides = {k[5:]: overrides.pop(k) for k in loss_keys}
  if loss_overrides.get("aggregation") == "seq_mean_token_sum_norm":
    loss_overrides.setdefault("norm_constant", float(max_tokens))
  try:
    loss = dataclasses.replace(loss, **loss_overrides)
  except ValueError as e:
    raise ValueError(f"cell '{label}': {e}") from None
  cell = Cell(label=label, estimator=name, options=tuple(sorted(overrides.items())),
              rollouts=rollouts, loss=loss)
  cell.estimator_options()  # fails early on an unknown estimator or option
  return cell


def default_labels() -> list[str]:
  """Every registered estimator on tree rollouts; PORTool's spec §4.1 ablations; GRPO and
  PORTool on independent rollouts and with the token-mean loss (the loss that DAPO pairs
  with, so that its effect is not read as the estimator's); GiGPO on the independent rollouts
  it was made for and with prefix anchors; GRPO with CISPO's loss (the bench takes two
  updates per batch, so the second sees ρ ≠ 1)."""
  labels = list(advantages.names())
  for name, variants in [
      ("portool", ["omega1=0", "shared_step_trj=own", "fork_scale=none", "rollouts=independent",
                   "loss.aggregation=token_mean"]),
      ("grpo", ["rollouts=independent", "loss.aggregation=token_mean", "loss.surrogate=cispo"]),
      ("gigpo", ["rollouts=independent", "anchor=prefix"])]:
    if name in labels:
      labels += [f"{name}/{v}" for v in variants]
  return labels


def split_labels(text: str) -> list[str]:
  """Comma-separated cell labels; an item with '=' but no '/' continues the previous label's
  options, so "grpo,portool/omega1=0,fork_scale=none" is two cells."""
  labels: list[str] = []
  for item in filter(None, (s.strip() for s in text.split(","))):
    if "=" in item and "/" not in item:
      if not labels:
        raise ValueError(f"cell labels: option '{item}' before any estimator name")
      labels[-1] += "," + item
    else:
      labels.append(item)
  return labels
