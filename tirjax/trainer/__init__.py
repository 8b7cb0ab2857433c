"""Experiment plumbing for `experiments/train.py`: tasks and tokenizers by environment name,
evaluation, supervised warm-start data. The training loop itself stays in the entry point."""
