"""One registry type for everything users extend: estimators, losses, scorers, engines, ...

Standard library only, so every layer may import it. A registry maps names (config values such
as ``algorithm.adv_estimator=grpo``) to objects, with per-entry metadata ("capabilities", e.g.
``needs_group``) instead of ``if name == ...`` checks in the callers::

    ESTIMATORS = Registry("advantage estimator", "algorithm.adv_estimator",
                          error=UnknownAlgorithmError, hint="register your own with @register_adv_est")

    @ESTIMATORS.register("grpo", needs_group=True)
    def compute_grpo_outcome_advantage(...): ...

    ESTIMATORS.get("grpo"); ESTIMATORS.capabilities("grpo")["needs_group"]

Built-ins may be named lazily as ``"module:attr"`` strings (``builtins=`` or
:meth:`Registry.register_lazy`), imported on first lookup so that importing the registry
stays light.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Set
from enum import Enum
from typing import Any, Iterator, Optional

from hybridrl.errors import UserError

__all__ = ["Registry", "RegistryError"]


class RegistryError(UserError, ValueError):
    """A registry name is unknown, already taken, or points at nothing; the message is one line."""


def _key(name: Any) -> Any:
    """An ``Enum`` member (verl's ``AdvantageEstimator.GRPO``) stands for its value."""
    return name.value if isinstance(name, Enum) else name


def _describe(obj: Any) -> str:
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    return f"{module}.{qualname}" if module else qualname


def _target(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '')}:{getattr(obj, '__qualname__', '')}"


class Registry:
    """Names to objects, with lazy built-ins, capabilities and one duplicate policy.

    Args:
        kind: what is registered, for messages ("advantage estimator").
        config_key: the config key whose value is looked up ("algorithm.adv_estimator").
        error: the :class:`RegistryError` subclass raised for unknown and taken names.
        replace: a later registration replaces an earlier one (only where documented);
            by default a second, different object under a taken name is refused.
        hint: how to add one, appended to the unknown-name message.
        builtins: ``name -> "module:attr"``, imported on first lookup.

    Raises:
        TypeError: ``error`` is not a RegistryError subclass.
    """

    def __init__(
        self,
        kind: str,
        config_key: Optional[str] = None,
        *,
        error: type = RegistryError,
        replace: bool = False,
        hint: Optional[str] = None,
        builtins: Optional[dict[str, str]] = None,
    ) -> None:
        if not (isinstance(error, type) and issubclass(error, RegistryError)):
            raise TypeError(f"Registry({kind!r}): error={error!r} must be a subclass of RegistryError")
        self.kind, self.config_key, self.error, self.replace, self.hint = kind, config_key, error, replace, hint
        self.table: dict[str, Any] = {}  # the loaded entries (live: verl-compatible dict aliases point here)
        self._lazy: dict[str, str] = {}
        self._caps: dict[str, dict[str, Any]] = {}
        for name, target in (builtins or {}).items():
            self.register_lazy(name, target)

    # ------------------------------------------------------------------ registration
    def register(self, name: Any, obj: Any = None, **capabilities: Any) -> Any:
        """Register ``obj`` under ``name`` (an Enum member stands for its value) with metadata;
        without ``obj``, return a decorator. Registering the same object again (a re-import)
        is allowed and updates its capabilities.

        Raises:
            RegistryError (``self.error``): ``name`` is not a non-empty string, or (unless
                ``replace``) another object is registered under it.
        """
        name = self._check_name(name)
        if obj is None:
            return lambda fn: self.register(name, fn, **capabilities)
        if not self.replace:
            self._refuse_duplicate(name, obj)
        self.table[name] = obj
        self._caps[name] = dict(capabilities)
        return obj

    def register_lazy(self, name: Any, target: str, **capabilities: Any) -> None:
        """Register ``"module:attr"`` under ``name``, imported on first :meth:`get`.

        Raises:
            RegistryError (``self.error``): a bad name or target, or (unless ``replace``) a taken name.
        """
        name = self._check_name(name)
        if not isinstance(target, str) or target.count(":") != 1:
            raise self.error(f"{self.kind} {name!r}: lazy target {target!r} must be a 'module:attr' string")
        taken = self._lazy.get(name) or (_target(self.table[name]) if name in self.table else None)
        if taken is not None and not self.replace and taken != target:
            raise self.error(f"{self.kind} {name!r} is already registered to {taken}; pick another name")
        self._lazy[name] = target
        self._caps.setdefault(name, dict(capabilities))

    def unregister(self, name: Any) -> None:
        """Forget ``name`` (loaded, lazy and capabilities); no error if it is absent (test cleanup)."""
        name = _key(name)
        for store in (self.table, self._lazy, self._caps):
            store.pop(name, None)

    def _check_name(self, name: Any) -> str:
        name = _key(name)
        if not isinstance(name, str) or not name:
            raise self.error(f"{self.kind} name {name!r} must be a non-empty string")
        return name

    def _refuse_duplicate(self, name: str, obj: Any) -> None:
        old = self.table.get(name)
        if old is not None and old is not obj:
            raise self.error(
                f"{self.kind} {name!r} is already registered to {_describe(old)}; "
                f"pick another name for {_describe(obj)}"
            )
        target = self._lazy.get(name)
        if old is None and target is not None and target != _target(obj):
            raise self.error(
                f"{self.kind} {name!r} is already registered to {target}; pick another name for {_describe(obj)}"
            )

    # ------------------------------------------------------------------ lookup
    def get(self, name: Any) -> Any:
        """The object registered as ``name``, importing a lazy built-in on first use.

        Raises:
            RegistryError (``self.error``): unknown name (the message names the config key, lists
                the known names and suggests the closest), or a lazy target without that attribute.
            ImportError: a lazy built-in's module (or a package it needs) cannot be imported.
        """
        name = _key(name)
        if isinstance(name, str) and name in self.table:
            return self.table[name]
        if isinstance(name, str) and name in self._lazy:
            return self.table.setdefault(name, self._load(name, self._lazy[name]))
        raise self.error(self.unknown_message(name))

    def _load(self, name: str, target: str) -> Any:
        module_name, attr = target.split(":")
        try:
            return getattr(importlib.import_module(module_name), attr)
        except AttributeError:
            raise self.error(f"{self.kind} {name!r} points at {target}, which does not exist") from None

    def unknown_message(self, name: Any) -> str:
        """The one-line message for an unknown ``name``: key, known names, closest match, hint."""
        names = self.names()
        head = f"{self.config_key}={name!r}" if self.config_key else repr(name)
        head += f" is not a known {self.kind}"
        close = difflib.get_close_matches(str(name), names, n=1, cutoff=0.6)
        if close:
            head += f" (did you mean {close[0]!r}?)"
        parts = [head, f"known: {', '.join(names) or '(none)'}"] + ([self.hint] if self.hint else [])
        return "; ".join(parts)

    def names(self) -> list[str]:
        """Sorted names of every entry, loaded or lazy."""
        return sorted(set(self.table) | set(self._lazy))

    def capabilities(self, name: Any) -> dict[str, Any]:
        """A copy of the metadata ``name`` was registered with (``{}`` if none).

        Raises:
            RegistryError (``self.error``): unknown name.
        """
        name = _key(name)
        if name not in self:
            raise self.error(self.unknown_message(name))
        return dict(self._caps.get(name, {}))

    def having(self, capability: str) -> CapabilityView:
        """A live, read-only set of the names whose ``capability`` is truthy."""
        return CapabilityView(self, capability)

    def __contains__(self, name: Any) -> bool:
        name = _key(name)
        return isinstance(name, str) and (name in self.table or name in self._lazy)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {len(self)} entries)"


class CapabilityView(Set):
    """Names in a registry whose capability is truthy; follows later registrations."""

    def __init__(self, registry: Registry, capability: str) -> None:
        self._registry, self._capability = registry, capability

    @classmethod
    def _from_iterable(cls, names):  # set operations (&, |, -) give a plain frozenset
        return frozenset(names)

    def __contains__(self, name: Any) -> bool:
        name = _key(name)
        return name in self._registry and bool(self._registry._caps.get(name, {}).get(self._capability))

    def __iter__(self) -> Iterator[str]:
        return (name for name in self._registry.names() if name in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"{{{', '.join(map(repr, self))}}}"
