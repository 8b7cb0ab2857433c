"""Experiment plumbing for `experiments/train.py`: the config's sections and their resolution,
tasks and tokenizers by environment name, each process's share of a step, evaluation,
supervised warm-start data. The training loop itself stays in the entry point."""
