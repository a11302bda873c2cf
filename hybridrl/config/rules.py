"""The single-key rules the config sections' ``__post_init__`` and ``validate`` share: each takes
the full key (for the message) and the value read by attribute, and raises one
:class:`~hybridrl.errors.ConfigError` line naming the key, what is wrong and what to set."""

from __future__ import annotations

from hybridrl.errors import ConfigError

__all__ = ["at_least", "one_of", "number_above", "positive", "plain", "is_unresolved", "value_at", "two_spellings"]


def is_unresolved(value) -> bool:
    """A default that is still an interpolation (``"${...}"``): a section built with its defaults
    alone (not from the run's config) holds these; the rules skip them."""
    return isinstance(value, str) and value.startswith("${")


def at_least(key: str, value, minimum: int, hint: str = "") -> int:
    """``value`` is an integer >= ``minimum`` (``hint``: what else the key may be).

    Raises:
        ConfigError: ``<key>=<value> must be an integer >= <minimum>; set <key> to one``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(
            f"{key}={value!r} must be an integer >= {minimum}{' ' + hint if hint else ''}; set {key} to one"
        )
    return value


def one_of(key: str, value, allowed) -> None:
    """``value`` is one of ``allowed``.

    Raises:
        ConfigError: ``<key>=<value> is not one of <allowed>; set one of them``.
    """
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not one of {', '.join(allowed)}; set one of them")


def number_above(value, bound: float) -> bool:
    """Whether ``value`` is a number (not a bool) greater than ``bound``."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > bound


def positive(key: str, value, usual: str) -> None:
    """``value`` is a number > 0 (``usual``: the message's example, e.g. ``"0.2 is usual"``).

    Raises:
        ConfigError: ``<key>=<value> must be a number > 0 (<usual>)``.
    """
    if not number_above(value, 0):
        raise ConfigError(f"{key}={value!r} must be a number > 0 ({usual})")


def two_spellings(old_key: str, old_value, old_default, new_key: str, new_value, new_default=None):
    """The value of one setting verl spells two ways, an older key and a newer one (each value read
    by attribute; the caller assigns the result): the one set away from its default wins, the newer
    one when both are set to the same value; neither set: ``old_value``.

    Raises:
        ConfigError: both set away from their defaults, to different values:
            ``<old_key>=<v> and <new_key>=<w> are verl's two spellings of one setting, set to
            different values; set only <new_key>``.
    """
    if new_value == new_default:
        return old_value
    if old_value != old_default and old_value != new_value:
        raise ConfigError(
            f"{old_key}={old_value!r} and {new_key}={new_value!r} are verl's two spellings of one setting, "
            f"set to different values; set only {new_key}"
        )
    return new_value


def plain(value):
    """DictConfig/ListConfig -> dict/list so values compare by content (other values as they are)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def value_at(config, key: str, default=None):
    """The value at ``key`` (a dotted key path taken from field metadata, such as
    :func:`marked_keys`' keys) of a typed config or a mapping, read part by part by attribute or
    item; ``default`` when a part is absent. For the generic walks over marked keys only: code
    that knows its key reads the typed field by attribute."""
    node = config
    for part in key.split("."):
        if isinstance(node, dict):
            node = node.get(part, _ABSENT)
        else:
            node = getattr(node, part, _ABSENT)
        if node is _ABSENT:
            return default
    return node


_ABSENT = object()
