"""Advantage estimators (SPEC §3-4), chosen by name through the registry.

    from tirjax import advantages
    est = advantages.get("portool")
    out = est(rollouts, est.make_options({"fork_scale": "none"}))
"""

from tirjax.advantages.registry import Advantages, Estimator, get, names, register
from tirjax.advantages import group  # noqa: F401  (registers grpo, arpo, grpo_fm, dr_grpo, rloo, dapo)
from tirjax.advantages import portool, unlearning  # noqa: F401  (registers portool)

__all__ = ["Advantages", "Estimator", "get", "names", "register"]
