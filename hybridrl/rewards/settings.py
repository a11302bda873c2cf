"""Reading the reward settings of a trainer config (an omegaconf DictConfig or nested dicts)."""

from __future__ import annotations

from typing import Any

from hybridrl.rewards.custom import RewardConfigError

__all__ = ["cfg_get", "plain", "to_plain_dict"]


def cfg_get(config: Any, dotted: str, default: Any = None) -> Any:
    """``config.a.b`` for a DictConfig or nested dicts, ``default`` where any part is missing."""
    node = config
    for part in dotted.split("."):
        if node is None or not hasattr(node, "get"):
            return default
        node = node.get(part, None)
    return default if node is None else node


def plain(value: Any) -> Any:
    """``value`` with omegaconf containers turned into plain dicts and lists; others unchanged."""
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(value):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:  # plain dict configs work without omegaconf
        pass
    return value


def to_plain_dict(value: Any, key: str) -> dict:
    """``value`` (a DictConfig or dict) as a plain dict.

    Raises:
        RewardConfigError: ``value`` is not a mapping (the message names ``key``).
    """
    value = plain(value)
    if not isinstance(value, dict):
        raise RewardConfigError(f"{key} is a {type(value).__name__}; it must be a mapping of keyword arguments")
    return value
