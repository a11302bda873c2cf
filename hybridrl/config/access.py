"""Reading and checking single keys of a config (a DictConfig or nested dicts), shared by the
start-up checks (:mod:`.schema`) and the batch-size arithmetic (:mod:`.batch_sizes`)."""

from __future__ import annotations

from hybridrl.errors import ConfigError

_UNSET = object()  # "no such key", as a returned default
_REQUIRED = object()  # no default: a missing key is an error


def _get(cfg, key: str, default=_REQUIRED):
    """Value at dotted ``key`` of a DictConfig or a plain dict; ConfigError when absent and no default."""
    node = cfg
    for part in key.split("."):
        try:
            node = node[part]
        except (KeyError, TypeError, AttributeError, IndexError) as exc:
            if default is not _REQUIRED:
                return default
            raise ConfigError(
                f"the config has no key '{key}'; add it (e.g. +{key}=...) or start from the packaged ppo_trainer.yaml"
            ) from exc
    return node


def _int_at_least(cfg, key: str, minimum: int, prefix: str | None = None, hint: str = "") -> int:
    value = _get(cfg, key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        name = f"{prefix}.{key}" if prefix else key
        raise ConfigError(
            f"{name}={value!r} must be an integer >= {minimum}{' ' + hint if hint else ''}; set {name} to one"
        )
    return value


def _number_above(value, bound: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > bound


def _plain(value):
    """DictConfig/ListConfig -> dict/list so values compare by content."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
