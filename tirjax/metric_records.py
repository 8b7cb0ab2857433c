"""A metric record's phase and its metrics' logged names, shared by every sink of a run's
metrics (`rundir.MetricsWriter`: metrics.jsonl and TensorBoard; `wandb_logger`: W&B), so that
neither sink imports the other."""

PHASES = ("sft", "rl", "eval")


def tag(phase: str, name: str) -> str:
  """A metric's TensorBoard and W&B name: `{phase}/{name}` unless it already has the prefix."""
  return name if name.startswith(f"{phase}/") else f"{phase}/{name}"
