"""Rollout engines. Importing the package registers the built-in ones."""

from hybridrl.workers.rollout import (
    hf,  # noqa: F401  (registers "hf")
    vllm,  # noqa: F401  (registers "vllm"; vLLM itself is imported when the engine is built)
    vllm_async,  # noqa: F401  (registers "vllm" for rollout.mode=async)
)
from hybridrl.workers.rollout.base import (
    ASYNC_ROLLOUT_REGISTRY,
    ASYNC_ROLLOUTS,
    OPTIONAL_ENGINES,
    ROLLOUT_REGISTRY,
    ROLLOUTS,
    BaseRollout,
    RolloutEngineError,
    RolloutNameError,
    SampledIds,
    get_rollout_cls,
    register_rollout,
)

__all__ = [
    "ASYNC_ROLLOUT_REGISTRY",
    "ASYNC_ROLLOUTS",
    "OPTIONAL_ENGINES",
    "ROLLOUT_REGISTRY",
    "ROLLOUTS",
    "BaseRollout",
    "RolloutEngineError",
    "RolloutNameError",
    "SampledIds",
    "get_rollout_cls",
    "register_rollout",
]
