"""A fast credit-assignment bench: an abstract tool-choice task with necessary steps.

    from tirjax.credit import ChainTask, ChainRolloutOptions, CreditTrainOptions, parse_cell, run_cell
    task = ChainTask()
    cell = parse_cell("portool/omega1=0", ChainRolloutOptions(), task.max_steps)
    result = run_cell(task, cell, seed=0)       # curve, final metrics, unlearning rates

Modules: `task` (the environment), `evaluate` (exact policy values), `softmax_policy` (an MLP
softmax policy), `chain_rollouts` (Algorithm-1 trees and independent rollouts as `Rollouts`),
`cells` (estimator, options, rollouts and loss of a labelled cell), `train` (one run),
`bench` (every cell over seeds, as `python -m experiments.studies.credit_bench` runs it).

A study package above the trainer. `rollout_fidelity` measures where each estimator puts
credit on a policy's real rollouts (spec §4.5; `python -m experiments.studies.credit_fidelity`)
with the measures of `tirjax.metrics.credit`, which the trainer also logs each step.
"""

from tirjax.credit.cells import Cell, default_labels, parse_cell
from tirjax.credit.softmax_policy import PolicyOptions
from tirjax.credit.chain_rollouts import ChainRolloutOptions, sample_batch
from tirjax.credit.task import ChainTask
from tirjax.credit.train import CreditTrainOptions, run_cell

__all__ = ["Cell", "ChainTask", "PolicyOptions", "ChainRolloutOptions", "CreditTrainOptions",
           "default_labels", "parse_cell", "run_cell", "sample_batch"]
