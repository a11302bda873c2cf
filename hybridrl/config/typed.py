"""Typed config sections: a YAML section becomes a dataclass (verl's ``omega_conf_to_dataclass``).

Each component owns the dataclass of its section (``hybridrl.algorithms.config.AlgoConfig`` for
``algorithm``, ...), with defaults equal to the packaged YAML and its single-field rules in
``__post_init__``. :func:`to_dataclass` builds one with OmegaConf's structured configs, so an
unknown key or a value of the wrong type is refused before any rule runs. Nested dataclass fields
are nested sections. Code reads the typed fields, never ``.get(key, default)``.
"""

from __future__ import annotations

from typing import Any, TypeVar

from hybridrl.errors import ConfigError

T = TypeVar("T")

__all__ = ["to_dataclass"]


def to_dataclass(cls: type[T], section: Any, prefix: str) -> T:
    """``section`` (a DictConfig, a mapping, or None for all defaults) as a ``cls`` instance.

    Args:
        cls: a dataclass whose fields are the section's keys (nested dataclasses for subsections).
        section: the config section; keys it lacks take the dataclass defaults.
        prefix: the section's key path, for messages (``"algorithm"``; ``""`` for a whole config).

    Raises:
        ConfigError: a key the dataclass has no field for, or a value OmegaConf cannot convert
            to the field's type (one line naming ``prefix.key``). The rules of ``__post_init__``
            raise their own errors.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigKeyError, ValidationError

    schema = OmegaConf.structured(cls)
    try:
        merged = OmegaConf.merge(schema, section if section is not None else {})
    except ConfigKeyError as exc:
        key = f"{prefix}.{exc.full_key}" if prefix else exc.full_key
        where = prefix or "this command's config"
        raise ConfigError(f"{key} is not a key of {where}; remove it (hybridrl config --show lists the keys)") from None
    except ValidationError as exc:
        key = f"{prefix}.{exc.full_key}" if prefix else exc.full_key
        reason = str(exc).splitlines()[0]
        raise ConfigError(f"{key}: {reason}; set a value of the type in the packaged YAML") from None
    return OmegaConf.to_object(merged)
