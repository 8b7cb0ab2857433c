"""The policy loss (spec §5): small formula modules and their composition.

    from tirjax import loss
    opts = loss.LossOptions(clip_high=0.28, aggregation="token_mean")   # DAPO
    out = loss.policy_loss(logprobs, old_logprobs, adv, loss_mask, row_mask, opts)
    out.loss.sum, out.loss.den      # accumulate over micro-batches, divide once
    loss.finalize(out)              # {"loss": ..., "metrics/ratio/mean": ..., ...}

Modules: `ratio` (token and GSPO ratios), `surrogate` (clip, dual clip, clip indicators),
`kl` (k1/k2/k3), `aggregation` (one record per mode, as (sum, den)), `diagnostics`, `stats`
(`Mean`, `Summary`, `accumulate`, `finalize`), `objective` (options and the composed loss).
"""

from tirjax.loss.aggregation import AGGREGATIONS, aggregate
from tirjax.loss.objective import LossOptions, LossOutput, policy_loss, rollouts_loss
from tirjax.loss.stats import Mean, Summary, accumulate, finalize

__all__ = ["AGGREGATIONS", "LossOptions", "LossOutput", "Mean", "Summary", "accumulate",
           "aggregate", "finalize", "policy_loss", "rollouts_loss"]
