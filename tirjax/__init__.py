"""tirjax: reinforcement learning of multi-turn, tool-using LLM agents in JAX/Flax.

Layout (spec §1): `rollouts` (the data contract) → `advantages` (estimator kernels, with
`matching` for tool-call alignment) → `loss` (the policy objective) → `models` (Flax
decoders and Hugging Face interchange); `env` (tools, episodes, judge) and `sampling`
(built-in JAX sampler, vLLM) produce `Rollouts`. The modules' layers, each importing only
from those below it: README's `### Layers` drawing (tests/test_package_imports.py).
"""

from tirjax.rollouts import CallEncoding, Rollouts, RolloutsError, validate

__all__ = ["CallEncoding", "Rollouts", "RolloutsError", "validate"]
