"""Measures of a training batch that the trainer logs and the studies read, below both.

Modules: `credit` (credit fidelity, spec §4.5: where an estimator puts credit, against turn
labels from the environment's registry entry).
"""
