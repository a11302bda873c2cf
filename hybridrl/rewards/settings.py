"""Plain values of reward settings: omegaconf containers as dicts and lists (scorers and reward
managers take plain keyword arguments)."""

from __future__ import annotations

from typing import Any

from hybridrl.rewards.custom import RewardConfigError

__all__ = ["plain", "to_plain_dict"]


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
