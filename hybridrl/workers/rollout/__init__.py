"""Rollout engines. Importing the package registers the built-in ones."""

from hybridrl.workers.rollout import hf  # noqa: F401  (registers "hf")
from hybridrl.workers.rollout.base import ROLLOUT_REGISTRY, BaseRollout, get_rollout_cls, register_rollout

__all__ = ["ROLLOUT_REGISTRY", "BaseRollout", "get_rollout_cls", "register_rollout"]
