"""Multi-turn episodes over the tool environment with any `Sampler`, and the rollout modes.

    from tirjax import rollout
    opts = rollout.RolloutOptions(mode="tree", shapes=rollout.Shapes(num_rows=64))
    batch = rollout.rollout(sampler, tokenizer, tasks, opts)   # tasks: 8 queries × n = 8 rows
    batch.rollouts      # padded `Rollouts` (validated), shapes fixed by `opts.shapes`
    batch.episodes      # one `EpisodeRecord` per row: texts, step results, verdict, summary

Modules: `options` (shapes and modes), `episode` (rows, the runner: sampling, execution,
token bookkeeping, truncation), `selection` (the pure survival rules of the tree and ARPO),
`modes` (independent, tree, arpo), `judging`, `assemble` (rows → `Rollouts` and records),
`batch` (the entry point), `timing` (tree vs independent rollouts at equal n).
"""

from tirjax.rollout.assemble import EpisodeRecord
from tirjax.rollout.batch import RolloutBatch, rollout
from tirjax.rollout.judging import Judge, rule_judge
from tirjax.rollout.options import MODES, ArpoOptions, RolloutOptions, Shapes, TreeOptions
from tirjax.rollout.timing import time_modes

__all__ = ["ArpoOptions", "EpisodeRecord", "Judge", "MODES", "RolloutBatch", "RolloutOptions",
           "Shapes", "TreeOptions", "rollout", "rule_judge", "time_modes"]
