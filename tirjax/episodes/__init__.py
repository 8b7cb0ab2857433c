"""Multi-turn episodes over the tool environment with any `Sampler`, and the rollout modes
(named apart from `tirjax.rollouts`, the data contract the episodes fill).

    from tirjax import episodes
    opts = episodes.RolloutOptions(mode="tree", shapes=episodes.Shapes(num_rows=64))
    batch = episodes.rollout(sampler, tokenizer, tasks, opts)   # tasks: 8 queries × n = 8 rows
    batch.rollouts      # padded `Rollouts` (validated), shapes fixed by `opts.shapes`
    batch.episodes      # one `EpisodeRecord` per row: texts, step results, verdict, summary

Modules: `options` (shapes and modes), `episode` (rows, the runner: sampling, execution,
token bookkeeping, truncation), `selection` (the pure survival rules of the tree and ARPO),
`modes` (independent, tree, arpo), `judging`, `assemble` (rows → `Rollouts` and records),
`batch` (the entry point), `timing` (tree vs independent rollouts at equal n).
"""

from tirjax.episodes.assemble import EpisodeRecord
from tirjax.episodes.batch import RolloutBatch, rollout
from tirjax.episodes.judging import Judge, rule_judge
from tirjax.episodes.options import MODES, ArpoOptions, RolloutOptions, Shapes, TreeOptions
from tirjax.episodes.timing import time_modes

__all__ = ["ArpoOptions", "EpisodeRecord", "Judge", "MODES", "RolloutBatch", "RolloutOptions",
           "Shapes", "TreeOptions", "rollout", "rule_judge", "time_modes"]
