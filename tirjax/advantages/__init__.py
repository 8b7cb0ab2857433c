"""Advantage estimators (spec §3-4), chosen by name through the registry.

    from tirjax import advantages
    est = advantages.get("portool")
    out = est(rollouts, est.make_options({"fork_scale": "none"}))
"""

from tirjax.advantages.registry import Advantages, Estimator, get, names, register
from tirjax.advantages import group  # noqa: F401  (grpo, arpo, grpo_fm, dr_grpo, rloo, dapo)
from tirjax.advantages import portool, unlearning  # noqa: F401  (portool)
from tirjax.advantages import hidifftir  # noqa: F401  (hidifftir)
from tirjax.advantages import matchtir  # noqa: F401  (matchtir_km, matchtir_ot)
from tirjax.advantages import toolrl  # noqa: F401  (toolrl)
from tirjax.advantages import ftrl  # noqa: F401  (ftrl)
# reinforce_plus_plus, reinforce_plus_plus_baseline, remax, opo, gpg, grpo_passk
from tirjax.advantages import verl_baselines  # noqa: F401
from tirjax.advantages import gigpo, tree_grpo  # noqa: F401  (gigpo, tree_grpo)
from tirjax.advantages import oracle  # noqa: F401  (oracle: a positive control, spec §4.4)
from tirjax.advantages import otb, gdpo  # noqa: F401  (optimal_token_baseline, tir_..., gdpo)
from tirjax.advantages import mt_grpo  # noqa: F401  (mt_grpo)

__all__ = ["Advantages", "Estimator", "get", "names", "register"]
