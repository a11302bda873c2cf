"""The config files of tools and interactions (verl's YAML formats): reading their top-level
list and resolving each entry's ``class_name``. Shared by :mod:`hybridrl.agents.tools.base` and
:mod:`hybridrl.agents.interactions.base`; needs no optional package."""

from __future__ import annotations

import importlib
import os
from typing import Any

from hybridrl.agents.errors import AgentConfigError
from hybridrl.registry import Registry, RegistryError

__all__ = ["read_yaml_list", "resolve_class"]


def resolve_class(
    registry: Registry, class_name: Any, aliases: dict[str, str], base: type, where: str, example: str = ""
) -> type:
    """The class a config's ``class_name`` means: a name in ``registry``, a verl dotted path in
    ``aliases``, or any dotted path to a ``base`` subclass.

    Raises:
        AgentConfigError: it cannot be imported or is not a ``base`` subclass (one line, ``where`` first).
    """
    try:
        if class_name in registry:
            cls = registry.get(class_name)
        else:
            module_name, _, attr = (aliases.get(class_name) or class_name).rpartition(".")
            cls = getattr(importlib.import_module(module_name), attr) if module_name else None
    except (ImportError, AttributeError, TypeError, RegistryError):
        cls = None
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise AgentConfigError(
            f"{where}: class_name={class_name!r} is not a {base.__name__} subclass that can be imported; use a "
            f"dotted path{example} or one of {', '.join(registry.names())}"
        )
    return cls


def read_yaml_list(path: str, key: str, config_key: str) -> list:
    """The list under ``key`` of a YAML file, with one-line errors naming ``config_key``."""
    import yaml

    if not os.path.isfile(path):
        raise AgentConfigError(f"{config_key}={path}: file not found; point it at a YAML file")
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except yaml.YAMLError as exc:
        raise AgentConfigError(f"{config_key}={path}: not valid YAML ({' '.join(str(exc).split())})") from None
    if not isinstance(data, dict) or not isinstance(data.get(key), list):
        raise AgentConfigError(f"{config_key}={path}: expected a top-level '{key}:' list")
    return data[key]
